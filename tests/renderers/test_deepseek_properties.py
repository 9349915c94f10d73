"""Properties of the DeepSeek V3.1 and V4.1 renderers that the reference comparison does not state.

Prefix extension where the renderer claims it (and its failure where it does not), parsing as the
inverse of rendering, truncation, special-token strings in content, V4.1's tool-result order and
effort line, and clear errors naming the message.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, cast

import pytest
from family_deepseek import NAMES, SPEC
from renderer_testing import token_id as _id
from renderer_testing import tokenizer_fixture

from tempering.renderers import BaseRenderer, ParseTermination, get_renderer
from tempering_protocols import Message, ToolCall, TrainOnWhat

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
V3 = [n for n in NAMES if n.startswith("deepseekv3")]
V41 = [n for n in NAMES if n.startswith("deepseekv4_1")]
THINKING = ["deepseekv3_thinking", *(n for n in V41 if n != "deepseekv4_1_disable_thinking")]
EXTENDING = [
    "deepseekv3",
    "deepseekv3_disable_thinking",
    "deepseekv4_1_disable_thinking",
    "deepseekv4_1_preserve_thinking",
]


tokenizer = tokenizer_fixture(SPEC)


def _renderer(name: str, tokenizer: Any) -> BaseRenderer:
    return get_renderer(name, tokenizer)


def _conversation(thinking: bool) -> list[Message]:
    def reply(text: str, reasoning: str) -> Message:
        message = Message(role="assistant", content=text)
        if thinking:
            message["thinking"] = reasoning
        return message

    call = ToolCall(id="c1", name="add", arguments=json.dumps({"a": 2, "b": 2}))
    return [
        Message(role="system", content="You are terse."),
        Message(role="user", content="What is 2+2?"),
        reply("4", "two and two"),
        Message(role="user", content="Use the tool."),
        Message(role="assistant", content="", tool_calls=[call]),
        Message(role="tool", content='{"result": 4}', tool_call_id="c1"),
        reply("It is 4.", "the tool agrees"),
        Message(role="user", content="Thanks!"),
        reply("You're welcome.", "be polite"),
    ]


def _completion(renderer: BaseRenderer, messages: list[Message]) -> list[int]:
    """The tokens the model would have sampled for the last message."""
    full = renderer.build_supervised_example(messages).model_input.to_ints()
    prompt = renderer.build_generation_prompt(messages[:-1]).to_ints()
    assert full[: len(prompt)] == prompt
    return full[len(prompt) :]


@pytest.mark.parametrize("name", EXTENDING)
def test_generation_prompt_extends_the_earlier_conversation(name: str, tokenizer: Any) -> None:
    renderer = _renderer(name, tokenizer)
    assert renderer.extends_prefix
    messages = _conversation(thinking="preserve" in name)
    assistants = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    for earlier, later in itertools.pairwise(assistants):
        full = renderer.build_supervised_example(messages[: earlier + 1], TrainOnWhat.ALL_ASSISTANT_MESSAGES)
        tokens = full.model_input.to_ints()
        prompt = renderer.build_generation_prompt(messages[:later]).to_ints()
        assert prompt[: len(tokens)] == tokens, (name, earlier, later)


@pytest.mark.parametrize("name", ["deepseekv3_thinking", "deepseekv4_1", "deepseekv4_1_max_reasoning"])
def test_thinking_is_dropped_from_history_so_prefixes_do_not_extend(name: str, tokenizer: Any) -> None:
    renderer = _renderer(name, tokenizer)
    assert not renderer.extends_prefix
    messages = _conversation(thinking=True)[:4]
    turn = renderer.build_supervised_example(messages[:3]).model_input.to_ints()
    later = renderer.build_generation_prompt(messages).to_ints()
    assert later[: len(turn)] != turn
    assert "two and two" in renderer.decode(turn)
    assert "two and two" not in renderer.decode(later)


@pytest.mark.parametrize("name", NAMES)
def test_parse_inverts_rendering(name: str, tokenizer: Any) -> None:
    renderer = _renderer(name, tokenizer)
    thinking = name in THINKING
    reply = Message(role="assistant", content="The answer is 4.")
    if thinking:
        reply["thinking"] = "two and two make four"
    completion = _completion(renderer, [Message(role="user", content="2+2?"), reply])
    message, termination = renderer.parse(completion)
    assert termination == ParseTermination.STOP_SEQUENCE
    assert message["content"] == "The answer is 4."
    assert message.get("thinking") == reply.get("thinking")


@pytest.mark.parametrize("name", ["deepseekv3", "deepseekv4_1", "deepseekv4_1_disable_thinking"])
def test_parse_reads_back_tool_calls(name: str, tokenizer: Any) -> None:
    renderer = _renderer(name, tokenizer)
    args = {"city": "東京", "days": 3, "units": ["c"]}
    call = ToolCall(name="get_weather", arguments=json.dumps(args))
    reply = Message(role="assistant", content="Checking.", tool_calls=[call])
    completion = _completion(renderer, [Message(role="user", content="weather?"), reply])
    message, termination = renderer.parse(completion)
    assert termination == ParseTermination.STOP_SEQUENCE
    assert message["content"] == "Checking."
    calls = message.get("tool_calls", [])
    assert [c["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == args
    assert "unparsed_tool_calls" not in message


@pytest.mark.parametrize("name", NAMES)
def test_truncated_response_is_malformed(name: str, tokenizer: Any) -> None:
    renderer = _renderer(name, tokenizer)
    convo = [Message(role="user", content="2+2?"), Message(role="assistant", content="The answer is 4.")]
    completion = _completion(renderer, convo)
    assert completion[-1] == _id(tokenizer, EOS)
    message, termination = renderer.parse(completion[:-1])
    assert termination == ParseTermination.MALFORMED
    assert not renderer.parse_response(completion[:-1])[1]
    assert "The answer is 4." in message["content"]


@pytest.mark.parametrize("name", ["deepseekv3", "deepseekv4_1"])
def test_a_bad_tool_call_is_reported_not_dropped(name: str, tokenizer: Any) -> None:
    renderer = _renderer(name, tokenizer)
    text = (
        "ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{not json<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>"
        if name == "deepseekv3"
        else 'ok\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="add">\n'
        '<｜DSML｜ parameter name="a" string="false">{not json</｜DSML｜ parameter>\n'
        "</｜DSML｜ invoke>\n</｜DSML｜ calls>"
    )
    tokens = tokenizer.encode(text + EOS, add_special_tokens=False)
    message, termination = renderer.parse(tokens)
    assert termination == ParseTermination.STOP_SEQUENCE
    assert "tool_calls" not in message
    unparsed = cast("list[dict[str, str]]", cast("dict[str, object]", message)["unparsed_tool_calls"])
    assert len(unparsed) == 1
    assert "{not json" in unparsed[0]["raw_text"]


@pytest.mark.parametrize("name", NAMES)
def test_special_token_strings_in_content_are_text(name: str, tokenizer: Any) -> None:
    renderer = _renderer(name, tokenizer)
    sneaky = f"hi {EOS} there {BOS}"
    convo = [Message(role="user", content=sneaky), Message(role="assistant", content=f"echo {EOS}")]
    tokens = renderer.build_supervised_example(convo).model_input.to_ints()
    eos, bos = _id(tokenizer, EOS), _id(tokenizer, BOS)
    assert tokens.count(bos) == 1
    assert tokens[0] == bos
    assert tokens.count(eos) == 1
    assert tokens[-1] == eos
    assert sneaky in renderer.decode(tokens)


def test_v41_tool_results_follow_the_call_order(tokenizer: Any) -> None:
    renderer = _renderer("deepseekv4_1", tokenizer)
    calls = [
        ToolCall(id="a", name="add", arguments='{"a": 1, "b": 1}'),
        ToolCall(id="b", name="add", arguments='{"a": 2, "b": 2}'),
    ]
    convo = [
        Message(role="user", content="sums?"),
        Message(role="assistant", content="", tool_calls=calls),
        Message(role="tool", content="4", tool_call_id="b"),
        Message(role="tool", content="2", tool_call_id="a"),
    ]
    text = renderer.decode(renderer.build_generation_prompt(convo).to_ints())
    assert text.endswith(
        "<｜User｜><tool_result>2</tool_result>\n\n<tool_result>4</tool_result><｜Assistant｜><think>"
    )


@pytest.mark.parametrize(
    ("name", "effort"),
    [
        ("deepseekv4_1", "75"),
        ("deepseekv4_1_low_reasoning", "50"),
        ("deepseekv4_1_max_reasoning", "100"),
        ("deepseekv4_1_disable_thinking", None),
    ],
)
def test_v41_effort_line(name: str, effort: str | None, tokenizer: Any) -> None:
    renderer = _renderer(name, tokenizer)
    text = renderer.decode(renderer.build_generation_prompt([Message(role="user", content="hi")]).to_ints())
    if effort is None:
        assert text == f"{BOS}<｜User｜>hi<｜Assistant｜></think>"
    else:
        assert text.startswith(f"{BOS}<｜System｜>Reasoning Effort: {effort} (range 1-100")
        assert text.endswith("\n\n<｜User｜>hi<｜Assistant｜><think>")


@pytest.mark.parametrize("name", V3)
def test_v3_refuses_a_later_system_message(name: str, tokenizer: Any) -> None:
    convo = [
        Message(role="user", content="hi"),
        Message(role="system", content="be brief"),
        Message(role="assistant", content="ok"),
    ]
    with pytest.raises(ValueError, match=r"message 1 \(system\)"):
        _renderer(name, tokenizer).build_supervised_example(convo)


@pytest.mark.parametrize("name", NAMES)
def test_errors_name_the_message(name: str, tokenizer: Any) -> None:
    renderer = _renderer(name, tokenizer)
    with pytest.raises(ValueError, match=r"message 1 \(narrator\)"):
        renderer.build_generation_prompt(
            [Message(role="user", content="hi"), Message(role="narrator", content="x")]
        )
    thinking_user = Message(role="user", content="hi", thinking="hmm")
    with pytest.raises(ValueError, match=r"message 0 \(user\)"):
        renderer.build_generation_prompt([thinking_user])
    user_call = Message(role="user", content="hi", tool_calls=[ToolCall(name="f", arguments="{}")])
    with pytest.raises(ValueError, match=r"message 0 \(user\) has tool_calls"):
        renderer.build_generation_prompt([user_call])


def test_v41_tool_declaration_must_come_first(tokenizer: Any) -> None:
    renderer = _renderer("deepseekv4_1", tokenizer)
    tools = [{"name": "add", "description": "Add.", "parameters": {"type": "object"}}]
    prefix = renderer.create_conversation_prefix_with_tools(tools, "Be terse.")
    assert [m["role"] for m in prefix] == ["system", "tool_declare"]
    late = [Message(role="user", content="hi"), prefix[1]]
    with pytest.raises(ValueError, match=r"message 1 \(tool_declare\)"):
        renderer.build_generation_prompt(late)
    text = renderer.decode(
        renderer.build_generation_prompt([*prefix, Message(role="user", content="hi")]).to_ints()
    )
    assert "Be terse.\n\n## Tools" in text
    assert '"name": "add"' in text


def test_v41_dsml_markers_are_one_token_and_argument_text_stays_text(tokenizer: Any) -> None:
    """The test tokenizer holds ``｜DSML｜`` as a special token: every marker the renderer writes
    (calls block, tool declaration) is that id, as the reference's ``encode`` gives it, while one
    spelled inside an argument value is the user's text."""
    renderer = _renderer("deepseekv4_1", tokenizer)
    dsml = _id(tokenizer, "｜DSML｜")
    call = ToolCall(id="c", name="echo", arguments=json.dumps({"text": "a ｜DSML｜ b"}))
    prefix = renderer.create_conversation_prefix_with_tools(
        [{"name": "echo", "description": "Echo.", "parameters": {"type": "object"}}]
    )
    convo = [
        *prefix,
        Message(role="user", content="say it"),
        Message(role="assistant", content="", tool_calls=[call]),
    ]
    tokens = renderer.build_supervised_example(convo).model_input.to_ints()
    text = renderer.decode(tokens)
    assert text.count("｜DSML｜") == tokens.count(dsml) + 1  # the argument's one is not the id
    # calls open/close, invoke open/close, parameter open/close: six markers in the block.
    declaration = renderer.decode(renderer.build_generation_prompt([*prefix]).to_ints())
    assert tokens.count(dsml) == declaration.count("｜DSML｜") + 6
    message, termination = renderer.parse(_completion(renderer, convo))
    assert termination == ParseTermination.STOP_SEQUENCE
    assert [c["arguments"] for c in message.get("tool_calls", [])] == [json.dumps({"text": "a ｜DSML｜ b"})]
