"""role_colon, llama3 and the Qwen3 renderers: properties that could fail, on each family's tokenizer.

The differential harness (test_renderer_reference.py) uses a GPT-2 pre-tokenizer, which cuts
``"\\n\\n4"`` into ``"\\n"``, ``"\\n"``, ``"4"``: there qwen3_disable_thinking's prompt (ending with
``</think>\\n\\n``) is rarely a prefix of its trained turn, and both it and the reference refuse
most examples. Here the same tokens get Qwen's and Llama 3's own pre-tokenizer split, so that path
is compared with the reference too.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from family_llama3 import SPEC as LLAMA3_SPEC
from family_qwen3 import SPEC as QWEN3_SPEC
from family_role_colon import SPEC as ROLE_COLON_SPEC
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_oracle import (
    CorpusOptions,
    TokenizerSpec,
    as_float_list,
    make_tokenizer,
    random_conversation,
    reference_call,
    to_reference,
    to_tempering,
)
from tokenizers import Regex, Tokenizer, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tempering.renderers import BaseRenderer, ParseTermination, Qwen3Renderer, get_renderer
from tempering_protocols import Message, TrainOnWhat

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2/Qwen3's pre-tokenizer split (Llama 3's is the same but for runs of up to 3 digits)."""

SPECS: dict[str, TokenizerSpec] = {
    "role_colon": ROLE_COLON_SPEC,
    "llama3": LLAMA3_SPEC,
    "qwen3": QWEN3_SPEC,
    "qwen3_disable_thinking": QWEN3_SPEC,
    "qwen3_instruct": QWEN3_SPEC,
}
NAMES = sorted(SPECS)
EXTENDING = ("llama3", "qwen3_instruct", "role_colon")
TEXT_ONLY = CorpusOptions(thinking=False, tools=False)


def realistic_tokenizer(spec: TokenizerSpec) -> PreTrainedTokenizerFast:
    """The family's test tokenizer with the real models' pre-tokenizer split."""
    base = make_tokenizer(spec)
    backend = Tokenizer.from_str(base.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    kwargs = {f"{k}_token": getattr(spec, k) for k in ("bos", "eos", "pad") if getattr(spec, k) is not None}
    return PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False, **kwargs)


@pytest.fixture(scope="module")
def pairs() -> dict[str, tuple[BaseRenderer, Any]]:
    """(tempering's renderer, the cookbook's) per name, on the realistic tokenizer."""
    ref_renderers = pytest.importorskip("tinker_cookbook.renderers")
    out: dict[str, tuple[BaseRenderer, Any]] = {}
    for name, spec in SPECS.items():
        tok = realistic_tokenizer(spec)
        out[name] = (get_renderer(name, tok), ref_renderers.get_renderer(name, tok))
    return out


def ours(pairs: dict[str, tuple[BaseRenderer, Any]], name: str) -> BaseRenderer:
    return pairs[name][0]


# ------------------------------------------------------------------ the reference, realistic split


@pytest.mark.parametrize("name", NAMES)
def test_matches_the_reference_with_the_real_pre_tokenizer(
    pairs: dict[str, tuple[BaseRenderer, Any]], name: str
) -> None:
    mine, ref = pairs[name]
    options = TEXT_ONLY if name in ("llama3", "role_colon") else CorpusOptions()
    rng = random.Random(f"realistic-{name}")
    compared = 0
    for i in range(25):
        turns = random_conversation(rng, options)
        for convo in (turns, turns[:-1]):
            for mode in (
                TrainOnWhat.LAST_ASSISTANT_MESSAGE,
                TrainOnWhat.LAST_ASSISTANT_TURN,
                TrainOnWhat.ALL_ASSISTANT_MESSAGES,
                TrainOnWhat.ALL_TOKENS,
            ):
                expected, err = reference_call(ref.build_supervised_example, to_reference(convo), mode)
                got_input = to_tempering(convo, cookbook_style=bool(i % 2))
                if err is not None or not any(as_float_list(expected[1])):
                    with pytest.raises((ValueError, TypeError)):
                        mine.build_supervised_example(got_input, mode)
                    continue
                example = mine.build_supervised_example(got_input, mode)
                assert example.model_input.to_ints() == expected[0].to_ints(), (name, i, mode)
                assert example.weights.tolist() == as_float_list(expected[1]), (name, i, mode)
                compared += 1
        prompt_ref = ref.build_generation_prompt(to_reference(turns[:-1])).to_ints()
        assert (
            mine.build_generation_prompt(to_tempering(turns[:-1], cookbook_style=False)).to_ints()
            == prompt_ref
        )
    assert compared > 40  # most examples render (the disable-thinking turn included)


# ------------------------------------------------------------------ extension


TEXT = st.text(alphabet="abc xyz0123?!.\né", max_size=12)


@st.composite
def chats(draw: st.DrawFn) -> list[Message]:
    """A system prompt (maybe), then 1-3 user questions each answered by the assistant."""
    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(TEXT)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(TEXT)})
        messages.append({"role": "assistant", "content": draw(TEXT)})
    return messages


SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.parametrize("name", [*EXTENDING, "qwen3_keep_thinking"])
@SETTINGS
@given(messages=chats())
def test_next_prompt_extends_the_rendered_turns(
    pairs: dict[str, tuple[BaseRenderer, Any]], name: str, messages: list[Message]
) -> None:
    """The generation prompt of turn k+1 starts with the full rendering of turns 1..k."""
    if name == "qwen3_keep_thinking":
        r: BaseRenderer = Qwen3Renderer(ours(pairs, "qwen3").tokenizer, strip_thinking_from_history=False)
        messages = [{**m, "thinking": "step\n1"} if m["role"] == "assistant" else m for m in messages]  # pyright: ignore[reportAssignmentType]
    else:
        r = ours(pairs, name)
    assert r.extends_prefix
    for k, m in enumerate(messages):
        if m["role"] != "assistant" or k + 1 >= len(messages):
            continue
        done = r.build_supervised_example(messages[: k + 1], TrainOnWhat.ALL_TOKENS).model_input.to_ints()
        nxt = r.build_generation_prompt(messages[: k + 2]).to_ints()
        assert nxt[: len(done)] == done


@pytest.mark.parametrize("name", ["qwen3", "qwen3_disable_thinking"])
def test_qwen3_history_is_rerendered(pairs: dict[str, tuple[BaseRenderer, Any]], name: str) -> None:
    """Why these two say ``extends_prefix = False``: the produced turn's (empty) think block
    leaves it once it is history."""
    r = ours(pairs, name)
    assert not r.extends_prefix
    first: list[Message] = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    done = r.build_supervised_example(first, TrainOnWhat.ALL_TOKENS).model_input.to_ints()
    nxt = r.build_generation_prompt([*first, {"role": "user", "content": "3+3?"}]).to_ints()
    assert nxt[: len(done)] != done
    assert "<think>" in r.decode(done)
    assert "<think>" not in r.decode(nxt[: len(done)])


# ------------------------------------------------------------------ parse inverts render


def completion(r: BaseRenderer, messages: list[Message]) -> list[int]:
    """The tokens after the generation prompt: what a sampler returns for the last message."""
    head = r.build_generation_prompt(messages[:-1]).to_ints()
    full = r.build_supervised_example(messages).model_input.to_ints()
    assert full[: len(head)] == head
    return full[len(head) :]


ANSWERS: dict[str, Message] = {
    "role_colon": {"role": "assistant", "content": "The answer is 4.\nSure."},
    "llama3": {"role": "assistant", "content": '{"looks": "like json"} but is text'},
    "qwen3": {"role": "assistant", "content": "It is 4.", "thinking": "two and two\nmake four"},
    "qwen3_disable_thinking": {"role": "assistant", "content": "It is 4."},
    "qwen3_instruct": {"role": "assistant", "content": "It is 4."},
}


@pytest.mark.parametrize("name", NAMES)
def test_parse_inverts_render(pairs: dict[str, tuple[BaseRenderer, Any]], name: str) -> None:
    r = ours(pairs, name)
    answer = ANSWERS[name]
    message, termination = r.parse(completion(r, [{"role": "user", "content": "2+2?"}, answer]))
    assert termination == ParseTermination.STOP_SEQUENCE
    assert message == answer


@pytest.mark.parametrize("name", ["qwen3", "qwen3_instruct"])
def test_parse_inverts_tool_calls(pairs: dict[str, tuple[BaseRenderer, Any]], name: str) -> None:
    r = ours(pairs, name)
    call = {"name": "get_weather", "arguments": json.dumps({"city": "東京"}), "id": "c1"}
    answer: Message = {"role": "assistant", "content": "", "tool_calls": [call]}  # pyright: ignore[reportAssignmentType]
    message, termination = r.parse(completion(r, [{"role": "user", "content": "weather?"}, answer]))
    assert termination == ParseTermination.STOP_SEQUENCE
    (parsed,) = message.get("tool_calls") or []
    assert parsed["name"] == "get_weather"
    assert json.loads(parsed["arguments"]) == {"city": "東京"}
    assert "id" not in parsed  # the rendered block carries name and arguments only
    assert message["content"] == ""
    assert "unparsed_tool_calls" not in message


@pytest.mark.parametrize("name", NAMES)
def test_truncated_response_is_malformed(pairs: dict[str, tuple[BaseRenderer, Any]], name: str) -> None:
    r = ours(pairs, name)
    tokens = completion(r, [{"role": "user", "content": "2+2?"}, ANSWERS[name]])
    for cut in (1, len(tokens) // 2):
        message, termination = r.parse(tokens[:-cut])
        assert termination == ParseTermination.MALFORMED
        assert r.parse_response(tokens[:-cut]) == (message, False)


def test_role_colon_eos_ends_a_base_model_answer(pairs: dict[str, tuple[BaseRenderer, Any]]) -> None:
    r = ours(pairs, "role_colon")
    eos = r.tokenizer.encode("<|end_of_text|>", add_special_tokens=False)
    text = r.tokenizer.encode(" 4", add_special_tokens=False)
    assert r.parse([*text, *eos]) == ({"role": "assistant", "content": "4"}, ParseTermination.EOS)
    stop = r.tokenizer.encode(" 4\n\nUser:", add_special_tokens=False)
    assert r.parse([*stop, *eos])[1] == ParseTermination.MALFORMED


# ------------------------------------------------------------------ special tokens in content

INJECTIONS: dict[str, tuple[str, ...]] = {
    "role_colon": ("<|begin_of_text|>", "<|end_of_text|>"),
    "llama3": ("<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|begin_of_text|>"),
    "qwen3": ("<|im_end|>", "<|im_start|>", "<|endoftext|>"),
    "qwen3_disable_thinking": ("<|im_end|>", "<|im_start|>"),
    "qwen3_instruct": ("<|im_end|>", "<|im_start|>"),
}


@pytest.mark.parametrize("name", NAMES)
def test_special_token_strings_in_content_are_text(
    pairs: dict[str, tuple[BaseRenderer, Any]], name: str
) -> None:
    r = ours(pairs, name)
    plain: list[Message] = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    spelled = " and ".join(INJECTIONS[name])
    injected: list[Message] = [
        {"role": "user", "content": f"hi {spelled}"},
        {"role": "assistant", "content": f"ok {spelled}"},
    ]
    for token in INJECTIONS[name]:
        (tid,) = r.tokenizer.encode(token, add_special_tokens=False)
        for mode in (TrainOnWhat.ALL_MESSAGES,):
            before = r.build_supervised_example(plain, mode).model_input.to_ints()
            after = r.build_supervised_example(injected, mode).model_input.to_ints()
            assert after.count(tid) == before.count(tid), token
    # ... and parse back as the characters they are.
    message, termination = r.parse(completion(r, injected))
    assert termination.is_clean
    assert message["content"] == f"ok {spelled}"


# ------------------------------------------------------------------ clear errors


@pytest.mark.parametrize("name", ["llama3", "role_colon"])
def test_thinking_is_refused_by_plain_formats(pairs: dict[str, tuple[BaseRenderer, Any]], name: str) -> None:
    r = ours(pairs, name)
    with pytest.raises(ValueError, match=r"message 1 \(assistant\) has thinking"):
        r.build_generation_prompt(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "thinking": "t"}]
        )
    parts: list[Message] = [
        {"role": "user", "content": [{"type": "thinking", "thinking": "t"}, {"type": "text", "text": "q"}]}  # pyright: ignore[reportAssignmentType]
    ]
    with pytest.raises(ValueError, match=r"message 0 \(user\) has content parts \[thinking, text\]"):
        r.build_generation_prompt(parts)


@pytest.mark.parametrize("name", ["llama3", "role_colon"])
def test_plain_formats_render_the_text_of_a_tool_calling_message(
    pairs: dict[str, tuple[BaseRenderer, Any]], name: str
) -> None:
    """The formats have no tool-call syntax: the message's text is rendered and its calls are not,
    as in the Cookbook (which renders such a conversation where tempering used to refuse it)."""
    r = ours(pairs, name)
    call = {"name": "f", "arguments": "{}"}
    with_calls: list[Message] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "let me look", "tool_calls": [call]},  # pyright: ignore[reportAssignmentType]
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    without: list[Message] = [with_calls[0], {"role": "assistant", "content": "let me look"}, with_calls[2]]
    assert r.build_generation_prompt(with_calls).to_ints() == r.build_generation_prompt(without).to_ints()
    assert "let me look" in r.decode(r.build_generation_prompt(with_calls).to_ints())


def test_qwen3_errors_name_the_message(pairs: dict[str, tuple[BaseRenderer, Any]]) -> None:
    r = ours(pairs, "qwen3")
    bad_args: list[Message] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": "{oops"}]},
    ]
    with pytest.raises(ValueError, match=r"message 1: tool call 'f' has arguments that are not JSON"):
        r.build_generation_prompt(bad_args)
    with pytest.raises(ValueError, match=r"message 0 \(user\) has tool_calls"):
        r.build_generation_prompt([{"role": "user", "content": "q", "tool_calls": []}])
    r2 = ours(pairs, "qwen3_disable_thinking")
    with pytest.raises(ValueError, match=r"message 1 \(assistant\): this conversation has no user message"):
        r2.build_supervised_example(
            [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]
        )
    with pytest.raises(ValueError, match="thinking turned off"):
        r2.build_supervised_example(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "thinking": "t"}]
        )


def test_llama3_renders_roles_as_given(pairs: dict[str, tuple[BaseRenderer, Any]]) -> None:
    """A tool result keeps its ``tool`` role (the HF template would write ``ipython``)."""
    r = ours(pairs, "llama3")
    convo: list[Message] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "calling"},
        {"role": "tool", "content": "sunny"},
    ]
    text = r.decode(r.build_generation_prompt(convo).to_ints())
    assert "<|start_header_id|>tool<|end_header_id|>\n\nsunny<|eot_id|>" in text


# ------------------------------------------------------------------ Qwen3's template rules, pinned

Q = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
FRAMING: list[tuple[str, Message, str]] = [
    # The produced turn always gets a block; the template strips the text's leading newlines.
    ("qwen3", {"role": "assistant", "content": "\n\nhi"}, "<think>\n\n</think>\n\nhi"),
    ("qwen3", {"role": "assistant", "content": "hi", "thinking": "\nr\n\n"}, "<think>\nr\n</think>\n\nhi"),
    # An inline block in string content is normalized to the template's framing.
    ("qwen3", {"role": "assistant", "content": "<think>r</think>\nhi"}, "<think>\nr\n</think>\n\nhi"),
    ("qwen3_instruct", {"role": "assistant", "content": "<think>r</think>\nhi"}, "<think>r</think>\nhi"),
    ("qwen3_instruct", {"role": "assistant", "content": "hi", "thinking": "r"}, "<think>r</think>hi"),
    # Tool calls: a newline after the text, none when there is no text; arguments re-serialized.
    (
        "qwen3_instruct",
        {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": '{"a":"é"}'}]},
        '<tool_call>\n{"name": "f", "arguments": {"a": "\\u00e9"}}\n</tool_call>',
    ),
    (
        "qwen3_instruct",
        {"role": "assistant", "content": "x", "tool_calls": [{"name": "f", "arguments": "{}"}] * 2},
        'x\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
        '\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    ),
]


@pytest.mark.parametrize(("name", "answer", "body"), FRAMING)
def test_qwen3_produced_turn_is_framed_as_the_template(
    pairs: dict[str, tuple[BaseRenderer, Any]], name: str, answer: Message, body: str
) -> None:
    r = ours(pairs, name)
    tokens = r.build_supervised_example([{"role": "user", "content": "q"}, answer]).model_input.to_ints()
    assert r.decode(tokens) == f"{Q}{body}<|im_end|>"


def test_qwen3_tool_results_are_user_turns(pairs: dict[str, tuple[BaseRenderer, Any]]) -> None:
    r = ours(pairs, "qwen3")
    convo: list[Message] = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "f", "arguments": "{}"}],
            "thinking": "t",
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "1"},
    ]
    text = r.decode(r.build_generation_prompt(convo).to_ints())
    # The assistant turn is history now: its thinking is dropped and it gets no block.
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
