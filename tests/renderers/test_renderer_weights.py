"""train_on_what modes on fixed conversations, and the errors for bad input."""

from __future__ import annotations

import math

import pytest

from tempering.renderers import BaseRenderer, NoTrainableTokensError, message_weights
from tempering_protocols import Message, TrainOnWhat

CONVO: list[Message] = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "A2"},
]


def trained_text(r: BaseRenderer, messages: list[Message], mode: TrainOnWhat | str) -> str:
    ex = r.build_supervised_example(messages, TrainOnWhat(mode))
    kept = [t for t, w in zip(ex.model_input.to_ints(), ex.weights, strict=True) if w]
    return r.decode(kept)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (TrainOnWhat.LAST_ASSISTANT_MESSAGE, [0, 0, 0, 0, 1]),
        (TrainOnWhat.ALL_ASSISTANT_MESSAGES, [0, 0, 1, 0, 1]),
        (TrainOnWhat.ALL_MESSAGES, [1, 1, 1, 1, 1]),
        (TrainOnWhat.ALL_TOKENS, [1, 1, 1, 1, 1]),
    ],
)
def test_message_weights(mode: TrainOnWhat, expected: list[int]) -> None:
    assert message_weights(CONVO, mode) == [float(x) for x in expected]


def test_last_assistant_message_is_the_last_one_with_that_role() -> None:
    convo: list[Message] = [*CONVO, {"role": "user", "content": "Q3"}]
    assert message_weights(convo, TrainOnWhat.LAST_ASSISTANT_MESSAGE) == [0, 0, 0, 0, 1, 0]


def test_modes_on_chatml(renderers: dict[str, BaseRenderer]) -> None:
    r = renderers["chatml"]
    assert trained_text(r, CONVO, "last_assistant_message") == "A2<|im_end|>"
    assert trained_text(r, CONVO, "all_assistant_messages") == "A1<|im_end|>A2<|im_end|>"
    assert (
        trained_text(r, CONVO, "all_messages")
        == "S<|im_end|>Q1<|im_end|>A1<|im_end|>Q2<|im_end|>A2<|im_end|>"
    )
    everything = r.build_supervised_example(CONVO, TrainOnWhat.ALL_TOKENS)
    assert everything.weights.all()


def test_customized_weights(renderers: dict[str, BaseRenderer]) -> None:
    r = renderers["llama3"]
    convo: list[Message] = [
        {"role": "user", "content": "Q", "weight": 0.0},
        {"role": "assistant", "content": "A", "weight": 0.5},
        {"role": "user", "content": "R", "weight": 2},
        {"role": "assistant", "content": "B"},  # no weight: 0
    ]
    ex = r.build_supervised_example(convo, TrainOnWhat.CUSTOMIZED)
    tokens = ex.model_input.to_ints()
    by_weight: dict[float, str] = {}
    for w in (0.5, 2.0):
        by_weight[w] = r.decode([t for t, x in zip(tokens, ex.weights, strict=True) if x == w])
    assert by_weight == {0.5: "A<|eot_id|>", 2.0: "R<|eot_id|>"}
    assert set(ex.weights.tolist()) == {0.0, 0.5, 2.0}


@pytest.mark.parametrize("mode", ["last_assistant_message", "all_assistant_messages"])
def test_no_assistant_message_is_an_error_naming_the_conversation(renderer: BaseRenderer, mode: str) -> None:
    convo: list[Message] = [{"role": "user", "content": "What is 2+2?"}]
    with pytest.raises(NoTrainableTokensError, match=r"\[user: 'What is 2\+2\?'\]") as info:
        renderer.build_supervised_example(convo, TrainOnWhat(mode))
    assert mode in str(info.value)
    assert "no assistant message" in str(info.value)


def test_all_zero_custom_weights_are_an_error(renderers: dict[str, BaseRenderer]) -> None:
    with pytest.raises(NoTrainableTokensError, match="customized"):
        renderers["chatml"].build_supervised_example(CONVO, TrainOnWhat.CUSTOMIZED)


def test_errors_in_a_batch_name_the_conversation(renderers: dict[str, BaseRenderer]) -> None:
    bad: list[Message] = [{"role": "user", "content": "lonely"}]
    with pytest.raises(NoTrainableTokensError, match=r"^chat.jsonl:7: train_on_what"):
        renderers["chatml"].build_supervised_examples([CONVO, bad], names=["chat.jsonl:3", "chat.jsonl:7"])
    broken: list[Message] = [{"role": "user", "content": 5}]  # pyright: ignore[reportAssignmentType]  # bad on purpose
    with pytest.raises(TypeError, match=r"^chat.jsonl:9: message 0 \(user\) has content of type int"):
        renderers["chatml"].build_supervised_examples([broken], names=["chat.jsonl:9"])
    with pytest.raises(NoTrainableTokensError, match=r"^conversation 1 of the batch: train_on_what"):
        renderers["chatml"].build_supervised_examples([CONVO, bad])
    with pytest.raises(ValueError, match="2 names for 1 conversations"):
        renderers["chatml"].build_supervised_examples([CONVO], names=["a", "b"])


@pytest.mark.parametrize(
    ("messages", "error", "match"),
    [
        ([], ValueError, "empty conversation"),
        ([{"content": "no role"}], ValueError, "message 0 has no role"),
        ([{"role": "user", "content": None}], TypeError, "content of type NoneType"),
        (["just text"], TypeError, "message 0 is a str"),
        ("not a list", TypeError, "sequence of messages"),
        ([{"role": "user", "content": "q", "weight": math.nan}], ValueError, "finite"),
    ],
)
def test_malformed_conversations(
    renderers: dict[str, BaseRenderer], messages: object, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        renderers["chatml"].build_supervised_example(messages, TrainOnWhat.CUSTOMIZED)  # pyright: ignore[reportArgumentType]  # bad on purpose


def test_unknown_mode(renderers: dict[str, BaseRenderer]) -> None:
    with pytest.raises(ValueError, match="everything"):
        renderers["chatml"].build_supervised_examples([CONVO], "everything")


def _a(content: str, **extra: object) -> Message:
    return {"role": "assistant", "content": content, **extra}  # pyright: ignore[reportReturnType]  # test shorthand


CALL_F = '{"name": "f", "arguments": {}}'


@pytest.mark.parametrize(
    ("name", "text", "expected", "ok"),
    [
        ("chatml", "4<|im_end|>", _a("4"), True),
        ("chatml", "4<|im_end|>junk after stop", _a("4"), True),
        ("chatml", "4 and then the budget ran out", _a("4 and then the budget ran out"), False),
        ("qwen3", "<think>\nhmm\n</think>\n\n4<|im_end|>", _a("4", thinking="hmm"), True),
        ("qwen3", "<think>\nstill thinking", _a("", thinking="still thinking"), False),
        ("qwen3", "<tool_call>\n{not json}\n</tool_call><|im_end|>", _a(""), False),
        (
            "qwen3",
            f"<tool_call>\n{CALL_F}\n</tool_call>trailing<|im_end|>",
            _a("", tool_calls=[{"name": "f", "arguments": "{}"}]),
            False,
        ),
        ("qwen3", f"<tool_call>\n{CALL_F}<|im_end|>", _a(""), False),
        ("llama3", "4<|eot_id|>", _a("4"), True),
        (
            "llama3",
            '{"name": "f", "parameters": {"x": 1}}<|eot_id|>',
            _a("", tool_calls=[{"name": "f", "arguments": '{"x": 1}'}]),
            True,
        ),
        ("llama3", "{not a call}<|eot_id|>", _a("{not a call}"), True),
        ("role_colon", " 4\n\nUser: next", _a("4"), True),
        ("role_colon", " 4\n\n", _a("4\n\n"), False),
        ("hf_template", "<think>\nx\n</think>\n\n4<|im_end|>\n", _a("4", thinking="x"), True),
    ],
)
def test_parse_response(
    renderers: dict[str, BaseRenderer], name: str, text: str, expected: Message, ok: bool
) -> None:
    r = renderers[name]
    assert r.parse_response(r.tokenizer.encode(text, add_special_tokens=False)) == (expected, ok)
