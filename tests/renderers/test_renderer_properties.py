"""Properties over random conversations: parse inverts render, prefixes extend, weights stay put.

The test tokenizer merges across the places renderers join pieces ("\\n" + "\\n\\n"), so a
renderer that re-tokenized a joined string would fail the prefix property here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Literal

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from renderer_tokenizers import SHARED_TOKENIZER_NAMES
from transformers import PreTrainedTokenizerFast

from tempering.renderers import RENDERERS, BaseRenderer, Qwen3Renderer, get_renderer
from tempering_protocols import Message, ToolCall, TrainOnWhat

# No "<", ":" or "{": content never spells a format marker, a stop string or a JSON tool call.
TEXT = st.text(alphabet="abcxyz ABC0123456789?+-=.,!\né", max_size=16)
Tools = Literal["none", "xml", "json"]

# What each format can carry: (thinking, tool-call style).
FEATURES: dict[str, tuple[bool, Tools]] = {
    "role_colon": (False, "none"),
    "chatml": (True, "xml"),
    "qwen3": (True, "xml"),
    "qwen3_keep_thinking": (True, "xml"),
    "qwen3_disable_thinking": (False, "xml"),
    "qwen3_instruct": (False, "xml"),
    "llama3": (False, "none"),
    "hf_template": (False, "none"),  # the test template renders role and content only
    "smollm2": (True, "xml"),
}

PROPERTY_SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def all_renderers(tokenizer: PreTrainedTokenizerFast) -> dict[str, BaseRenderer]:
    out = {name: get_renderer(name, tokenizer) for name in SHARED_TOKENIZER_NAMES}
    out["qwen3_keep_thinking"] = Qwen3Renderer(tokenizer, strip_thinking_from_history=False)
    return out


def test_features_cover_the_shared_tokenizer_renderers() -> None:
    assert set(SHARED_TOKENIZER_NAMES) <= set(FEATURES)
    assert set(SHARED_TOKENIZER_NAMES) <= set(RENDERERS)


FRAMED = ("qwen3", "qwen3_keep_thinking", "qwen3_disable_thinking")
"""Renderers that frame the produced turn as Qwen3's template does: ``<think>\\n…\\n</think>\\n\\n``
(padding newlines of the reasoning and leading newlines of the text are framing, not content)."""

NOT_EXTENDING = ("qwen3", "qwen3_disable_thinking")
"""Thinking (or its empty block) is written only in the produced turn: history is re-rendered."""


@st.composite
def tool_calls(draw: st.DrawFn) -> ToolCall:
    args = draw(st.dictionaries(st.sampled_from(["a", "city", "n"]), st.integers(-5, 99) | TEXT, max_size=2))
    return ToolCall(name=draw(st.sampled_from(["add", "weather"])), arguments=json.dumps(args))


@st.composite
def conversations(draw: st.DrawFn, thinking: bool, tools: Tools) -> list[Message]:
    """System prompt (maybe), then 1-3 user turns each answered by the assistant.

    An assistant turn may think, or call tools, in which case tool results and a final answer follow.
    """
    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(TEXT)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(TEXT)})
        answer: Message = {"role": "assistant", "content": draw(TEXT)}
        if thinking and draw(st.booleans()):
            answer["thinking"] = draw(TEXT)
        if tools != "none" and draw(st.booleans()):
            calls = draw(st.lists(tool_calls(), min_size=1, max_size=2))
            answer["tool_calls"] = calls
            if tools == "json":
                answer["content"] = ""
            messages.append(answer)
            results: list[Message] = [{"role": "tool", "content": draw(TEXT)} for _ in calls]
            messages += results
            answer = {"role": "assistant", "content": draw(TEXT)}
        messages.append(answer)
    return messages


def for_each_renderer(
    test: Callable[[BaseRenderer, list[Message]], None], names: list[str] | None = None
) -> Callable[..., None]:
    """Parametrize ``test`` over renderers, drawing conversations that the renderer can carry."""

    @pytest.mark.parametrize("name", names or sorted(FEATURES))
    @PROPERTY_SETTINGS
    @given(data=st.data())
    def run(name: str, data: st.DataObject, all_renderers: dict[str, BaseRenderer]) -> None:
        thinking, tools = FEATURES[name]
        test(all_renderers[name], data.draw(conversations(thinking, tools)))

    run.__name__ = test.__name__
    run.__doc__ = test.__doc__
    return run


def normalized(message: Message, renderer: BaseRenderer | None = None) -> dict[str, object]:
    """What a parse must reproduce: empty thinking/tool calls are absent, arguments compared as JSON.

    Given the renderer, what its format cannot carry is left out: the framing newlines of a
    Qwen3 think block, role_colon's trailing blank line (it is the separator's).
    """
    content, thinking = message["content"], message.get("thinking") or ""
    if renderer is not None and renderer.name in ("qwen3", "qwen3_disable_thinking"):
        content, thinking = content.lstrip("\n"), thinking.strip("\n")
    if renderer is not None and renderer.name == "role_colon":
        content = content.removesuffix("\n\n")
    out: dict[str, object] = {"role": message["role"], "content": content}
    if thinking:
        out["thinking"] = thinking
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [(c["name"], json.loads(c["arguments"])) for c in calls]
    return out


def tokens(renderer: BaseRenderer, messages: list[Message]) -> list[int]:
    return renderer.build_supervised_example(messages, TrainOnWhat.ALL_TOKENS).model_input.to_ints()


def prompt(renderer: BaseRenderer, messages: list[Message]) -> list[int]:
    return renderer.build_generation_prompt(messages).to_ints()


def overlap(renderer: BaseRenderer, last_role: str = "assistant") -> int:
    """Tokens a supervised rendering adds after its last message, which a longer conversation does
    not have there: role_colon's "User:" (the stop string's, supplied later by the next header)
    after an assistant message, its "<UNUSED>" placeholder after any other."""
    if renderer.name != "role_colon":
        return 0
    tail = "User:" if last_role == "assistant" else "<UNUSED>"
    return len(renderer.tokenizer.encode(tail, add_special_tokens=False))


def newline_run_after_block(renderer: BaseRenderer, messages: list[Message]) -> bool:
    """Qwen3 without thinking: the prompt ends ``</think>\\n\\n``; text starting with spaces and a
    newline joins that ``\\n\\n`` into one pre-token, so the prompt is no prefix of the turn (the
    cookbook refuses such a turn too, as reasoning after a closed block)."""
    return renderer.name == "qwen3_disable_thinking" and bool(
        re.match(r"[^\S\n]+\n", messages[-1]["content"].lstrip("\n"))
    )


def _round_trip(renderer: BaseRenderer, messages: list[Message]) -> None:
    """The last assistant turn, rendered after its prompt and parsed back, is the same message."""
    assume(not newline_run_after_block(renderer, messages))
    head = prompt(renderer, messages[:-1])
    full = tokens(renderer, messages)
    assert full[: len(head)] == head
    parsed, ok = renderer.parse_response(full[len(head) :])
    assert ok
    assert normalized(parsed) == normalized(messages[-1], renderer)


test_render_then_parse_round_trips = for_each_renderer(_round_trip)


def _prefix(renderer: BaseRenderer, messages: list[Message]) -> None:
    """Renderings of conversations up to an assistant turn extend, token for token, into every
    later rendering and generation prompt (what multi-turn RL relies on)."""
    assert renderer.extends_prefix
    rendered = [tokens(renderer, messages[:j]) for j in range(1, len(messages) + 1)]
    prompts = [prompt(renderer, messages[:j]) for j in range(1, len(messages) + 1)]
    for j, shorter in enumerate(rendered, start=1):
        if messages[j - 1]["role"] != "assistant":
            continue  # role_colon ends a rendering that stops at a user turn with a placeholder
        for longer in [*rendered[j:], *prompts[j:]]:
            assert longer[: len(shorter)] == shorter


test_prefix_extension = for_each_renderer(_prefix, [n for n in sorted(FEATURES) if n not in NOT_EXTENDING])


def _assistant_weights(renderer: BaseRenderer, messages: list[Message]) -> None:
    """Assistant-only modes weight exactly each chosen assistant completion: never prompt tokens."""
    assert renderer.extends_prefix, "spans are located through prefixes"
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    last = len(messages) - 1
    spans = {
        i: (
            len(prompt(renderer, messages[:i])),
            len(tokens(renderer, messages[: i + 1])) - (overlap(renderer) if i < last else 0),
        )
        for i in assistants
    }
    for mode, chosen in (
        (TrainOnWhat.ALL_ASSISTANT_MESSAGES, assistants),
        (TrainOnWhat.LAST_ASSISTANT_MESSAGE, assistants[-1:]),
    ):
        weights = renderer.build_supervised_example(messages, mode).weights
        expected = np.zeros_like(weights)
        for i in chosen:
            start, end = spans[i]
            assert end > start
            expected[start:end] = 1.0
        np.testing.assert_array_equal(weights, expected)
    every = renderer.build_supervised_example(messages, TrainOnWhat.ALL_MESSAGES).weights
    assert set(every.tolist()) <= {0.0, 1.0}
    for i in assistants:  # the assistant header is still prompt
        start = len(tokens(renderer, messages[:i])) - overlap(renderer, messages[i - 1]["role"]) if i else 0
        assert start < spans[i][0]
        assert not every[start : spans[i][0]].any()
    # All tokens but the BOS prefix, which nothing predicts.
    bos = sum(len(p) for p in renderer.render(messages, generation=False).prefix if isinstance(p, tuple))
    everything = renderer.build_supervised_example(messages, TrainOnWhat.ALL_TOKENS).weights
    assert not everything[:bos].any()
    assert everything[bos:].all()


test_weights_stay_on_assistant_completions = for_each_renderer(
    _assistant_weights, [n for n in sorted(FEATURES) if n not in NOT_EXTENDING]
)


def _last_turn_weights(renderer: BaseRenderer, messages: list[Message]) -> None:
    """Even without prefix extension, the last turn's prompt gets weight 0 and its completion 1."""
    assume(not newline_run_after_block(renderer, messages))
    head = prompt(renderer, messages[:-1])
    ex = renderer.build_supervised_example(messages, TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    assert ex.model_input.to_ints()[: len(head)] == head
    assert not ex.weights[: len(head)].any()
    assert ex.weights[len(head) :].all()


test_last_turn_weights = for_each_renderer(_last_turn_weights)


def _custom_weights(renderer: BaseRenderer, messages: list[Message]) -> None:
    """Customized weights: each message's completion carries its own weight."""
    weighted: list[Message] = [{**m, "weight": 0.25 * (i % 4)} for i, m in enumerate(messages)]
    if not any(m.get("weight") for m in weighted):
        return
    weights = renderer.build_supervised_example(weighted, TrainOnWhat.CUSTOMIZED).weights
    assert set(weights.tolist()) <= {0.0, 0.25, 0.5, 0.75}
    # A message whose weight is unique shows up; weight-0 messages never do.
    assert set(weights.tolist()) - {0.0} == {m.get("weight") for m in weighted} - {0.0}


test_custom_weights = for_each_renderer(_custom_weights)


def _batch_equals_single(renderer: BaseRenderer, messages: list[Message]) -> None:
    """One batch tokenizer call gives what rendering one conversation at a time gives."""
    batch = [messages, messages[:2], messages]
    together = renderer.build_supervised_examples(batch, TrainOnWhat.ALL_MESSAGES)
    for convo, ex in zip(batch, together, strict=True):
        alone = renderer.build_supervised_example(convo, TrainOnWhat.ALL_MESSAGES)
        assert ex.model_input.to_ints() == alone.model_input.to_ints()
        np.testing.assert_array_equal(ex.weights, alone.weights)
        assert ex.weights.dtype == np.float32


test_batch_equals_single = for_each_renderer(_batch_equals_single, ["chatml", "hf_template", "llama3"])


def test_qwen3_does_not_extend_prefixes(all_renderers: dict[str, BaseRenderer]) -> None:
    """The counterexample behind ``extends_prefix = False``: thinking leaves history."""
    r = all_renderers["qwen3"]
    first: list[Message] = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "thinking": "two twos"},
    ]
    rendered = tokens(r, first)
    later = prompt(r, [*first, {"role": "user", "content": "3+3?"}])
    assert later[: len(rendered)] != rendered


def test_piecewise_tokenization_matters(tokenizer: PreTrainedTokenizerFast) -> None:
    """Guard: this tokenizer tokenizes joined text differently from its joined pieces."""
    pieces = tokenizer.encode(" a\n", add_special_tokens=False) + tokenizer.encode(
        "\n\n", add_special_tokens=False
    )
    assert pieces != tokenizer.encode(" a\n\n\n", add_special_tokens=False)
