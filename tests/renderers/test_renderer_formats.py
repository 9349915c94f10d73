"""Each format, pinned: exact renderings, trained spans, stop sequences, special-token lookup."""

from __future__ import annotations

import pickle
import re

import pytest
import tinker
from renderer_tokenizers import (
    CHATML_TEMPLATE,
    LLAMA3_TEMPLATE,
    SHARED_TOKENIZER_NAMES,
    make_plain_tokenizer,
    make_tokenizer,
)
from transformers import PreTrainedTokenizerFast

from tempering.renderers import (
    RENDERERS,
    BaseRenderer,
    HFTemplateRenderer,
    MissingSpecialTokenError,
    Qwen3Renderer,
    TemplateNotPrefixStableError,
    get_renderer,
)
from tempering_protocols import Message, Renderer, TrainOnWhat

CONVO: list[Message] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6"},
]

# (rendering of CONVO, the text of its weighted tokens under ALL_ASSISTANT_MESSAGES)
EXPECTED = {
    # The tokenizer's BOS starts it; the stop string's "User:" ends the last (trained) turn.
    "role_colon": (
        "<|begin_of_text|>System: Be brief.\n\nUser: What is 2+2?\n\nAssistant: 4\n\n"
        "User: And 3+3?\n\nAssistant: 6\n\nUser:",
        " 4\n\n 6\n\nUser:",
    ),
    "chatml": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n6<|im_end|>",
        "4<|im_end|>6<|im_end|>",
    ),
    "qwen3": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n6<|im_end|>",
        "4<|im_end|><think>\n\n</think>\n\n6<|im_end|>",
    ),
    # As the template: only the produced (last) turn gets the empty think block.
    "qwen3_disable_thinking": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n6<|im_end|>",
        "4<|im_end|><think>\n\n</think>\n\n6<|im_end|>",
    ),
    "qwen3_instruct": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n6<|im_end|>",
        "4<|im_end|>6<|im_end|>",
    ),
    "llama3": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n6<|eot_id|>",
        "4<|eot_id|>6<|eot_id|>",
    ),
    "hf_template": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n6<|im_end|>\n",
        "4<|im_end|>\n6<|im_end|>\n",
    ),
    # A system message given: plain ChatML (without one, SmolLM2's default; test_smollm2.py).
    "smollm2": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n6<|im_end|>",
        "4<|im_end|>6<|im_end|>",
    ),
}


def test_every_shared_tokenizer_renderer_is_pinned() -> None:
    assert set(EXPECTED) == set(SHARED_TOKENIZER_NAMES)
    assert set(EXPECTED) <= set(RENDERERS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_rendering_and_trained_span(name: str, renderers: dict[str, BaseRenderer]) -> None:
    r = renderers[name]
    tok = r.tokenizer
    ex = r.build_supervised_example(CONVO, TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    tokens = ex.model_input.to_ints()
    text, trained = EXPECTED[name]
    assert tok.decode(tokens) == text
    assert tok.decode([t for t, w in zip(tokens, ex.weights, strict=True) if w]) == trained
    assert set(ex.weights.tolist()) == {0.0, 1.0}


def test_renderers_satisfy_the_protocol(renderer: BaseRenderer) -> None:
    assert isinstance(renderer, Renderer)
    assert isinstance(renderer.extends_prefix, bool)


def test_extends_prefix_flags(renderers: dict[str, BaseRenderer]) -> None:
    flags = {name: r.extends_prefix for name, r in renderers.items()}
    assert flags == {
        "role_colon": True,
        "chatml": True,
        "qwen3": False,
        "qwen3_disable_thinking": False,
        "qwen3_instruct": True,
        "llama3": True,
        "hf_template": True,
        "smollm2": True,
    }


def test_stop_sequences(renderers: dict[str, BaseRenderer], tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer.convert_tokens_to_ids
    assert renderers["role_colon"].get_stop_sequences() == ["\n\nUser:"]
    for name in ("chatml", "qwen3", "qwen3_disable_thinking", "qwen3_instruct", "hf_template", "smollm2"):
        assert renderers[name].get_stop_sequences() == [ids("<|im_end|>")]
    assert renderers["llama3"].get_stop_sequences() == [ids("<|eot_id|>")]


@pytest.mark.parametrize(
    "name", ["chatml", "qwen3", "qwen3_disable_thinking", "qwen3_instruct", "llama3", "hf_template"]
)
def test_token_stop_ends_every_trained_assistant_turn(name: str, renderers: dict[str, BaseRenderer]) -> None:
    """The stop token is the last token of the completion, and it is trained on."""
    r = renderers[name]
    (stop,) = r.get_stop_sequences()
    prompt = r.build_generation_prompt(CONVO[:2]).to_ints()
    ex = r.build_supervised_example(CONVO[:3], TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    tokens = ex.model_input.to_ints()
    completion = tokens[len(prompt) :]
    assert stop in completion
    assert ex.weights[len(prompt) + completion.index(stop)] == 1.0


def test_generation_prompts_match_hf_templates(tokenizer: PreTrainedTokenizerFast) -> None:
    """Generation prompts are the templates' text, tokenized as the tokenizer tokenizes it.

    Token-equal because this tokenizer's pre-tokenizer (Llama 3's split) cuts the joined text
    where the renderers join their pieces: at special tokens and before and after ``\\n\\n``.
    """
    llama_tok = make_tokenizer(LLAMA3_TEMPLATE, eos_token="<|eot_id|>")
    for name, tok in (("chatml", tokenizer), ("llama3", llama_tok)):
        r = get_renderer(name, tok)
        for k in (2, 4):
            plain = [{"role": m["role"], "content": m["content"]} for m in CONVO[:k]]
            text = tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
            assert isinstance(text, str)
            tokens = r.build_generation_prompt(CONVO[:k]).to_ints()
            assert tok.decode(tokens) == text, name
            assert tokens == tok.encode(text, add_special_tokens=False), name


def test_generation_prompt_of_empty_conversation(renderers: dict[str, BaseRenderer]) -> None:
    tok = renderers["llama3"].tokenizer
    prompt = renderers["llama3"].build_generation_prompt([])
    assert isinstance(prompt, tinker.ModelInput)
    assert (
        tok.decode(prompt.to_ints()) == "<|begin_of_text|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_thinking_in_each_format(renderers: dict[str, BaseRenderer]) -> None:
    thought: list[Message] = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "thinking": "two twos"},
        {"role": "user", "content": "3+3?"},
    ]

    def prompt(name: str) -> str:
        return renderers[name].decode(renderers[name].build_generation_prompt(thought).to_ints())

    assert "<think>\ntwo twos\n</think>\n\n4<|im_end|>" in prompt("chatml")
    assert "two twos" not in prompt("qwen3")  # stripped from history
    keep = Qwen3Renderer(renderers["chatml"].tokenizer, strip_thinking_from_history=False)
    assert keep.extends_prefix
    assert "<think>\ntwo twos\n</think>\n\n4" in keep.decode(keep.build_generation_prompt(thought).to_ints())
    # Thinking off: history thinking is dropped (as the template drops it), but a trained turn
    # that reasons is refused (its prompt closed the think block).
    assert "two twos" not in prompt("qwen3_disable_thinking")
    with pytest.raises(ValueError, match="thinking turned off"):
        renderers["qwen3_disable_thinking"].build_supervised_example(thought[:2])
    # Instruct-2507 writes no block of its own; thinking given in the last turn stays, unframed.
    assert "two twos" not in prompt("qwen3_instruct")
    instruct = renderers["qwen3_instruct"]
    last = instruct.decode(instruct.build_supervised_example(thought[:2]).model_input.to_ints())
    assert last.endswith("<|im_start|>assistant\n<think>two twos</think>4<|im_end|>")
    for name in ("llama3", "role_colon"):
        with pytest.raises(ValueError, match="thinking"):
            renderers[name].build_generation_prompt(thought)


def test_tool_calls_and_results(renderers: dict[str, BaseRenderer]) -> None:
    tok = renderers["qwen3"].tokenizer
    convo: list[Message] = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [{"name": "weather", "arguments": '{"city": "Paris"}'}],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "1"},
    ]
    qwen = tok.decode(renderers["qwen3"].build_generation_prompt(convo).to_ints())
    assert (
        'Checking.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
        in qwen
    )
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in qwen
    chatml = tok.decode(renderers["chatml"].build_generation_prompt(convo).to_ints())
    assert "<|im_start|>tool\nsunny<|im_end|>" in chatml
    # Neither format has tool-call syntax: the text is written, the calls are not (as the Cookbook).
    llama = tok.decode(renderers["llama3"].build_generation_prompt(convo).to_ints())
    assert "assistant<|end_header_id|>\n\nChecking.<|eot_id|>" in llama
    assert "<|start_header_id|>tool<|end_header_id|>\n\nsunny<|eot_id|>" in llama  # the role as given
    assert "Assistant: Checking.\n\nTool: sunny" in tok.decode(
        renderers["role_colon"].build_generation_prompt(convo).to_ints()
    )
    convo[1]["tool_calls"] = [{"name": "weather", "arguments": "not json"}]
    with pytest.raises(ValueError, match="not a JSON object"):
        renderers["chatml"].build_generation_prompt(convo)


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        ("chatml", "<|im_start|>"),
        ("qwen3", "<|im_start|>"),
        ("qwen3_disable_thinking", "<|im_start|>"),
        ("qwen3_instruct", "<|im_start|>"),
        ("llama3", "<|begin_of_text|>"),
        ("hf_template", None),
    ],
)
def test_missing_special_token_is_named(name: str, missing: str | None) -> None:
    plain = make_plain_tokenizer()
    if missing is None:
        with pytest.raises(ValueError, match="chat_template"):
            get_renderer(name, plain)
        return
    with pytest.raises(MissingSpecialTokenError, match=missing.replace("|", r"\|")) as info:
        get_renderer(name, plain)
    assert info.value.token == missing
    assert name in str(info.value)
    again = pickle.loads(pickle.dumps(info.value))
    assert again.token == missing
    assert str(again) == str(info.value)


def test_qwen3_needs_its_think_tokens() -> None:
    tok = make_tokenizer(added_tokens=())
    get_renderer("chatml", tok)  # ChatML alone does not need them
    for name in ("qwen3", "qwen3_disable_thinking"):
        with pytest.raises(MissingSpecialTokenError, match="<think>"):
            get_renderer(name, tok)


def test_role_colon_needs_no_special_token() -> None:
    r = get_renderer("role_colon", make_plain_tokenizer())
    ex = r.build_supervised_example(CONVO[1:3])
    # No BOS token: no prefix. The trained turn ends with the stop string's "User:".
    assert r.tokenizer.decode(ex.model_input.to_ints()) == "User: What is 2+2?\n\nAssistant: 4\n\nUser:"


def test_unknown_renderer_lists_names(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match="known: role_colon, llama3, chatml, qwen3,"):
        get_renderer("vicuna", tokenizer)


def test_hf_template_stop_tokens_and_llama_template(
    llama_template_tokenizer: PreTrainedTokenizerFast,
) -> None:
    tok = llama_template_tokenizer
    r = get_renderer("hf_template", tok)
    assert r.get_stop_sequences() == [tok.convert_tokens_to_ids("<|eot_id|>")]
    llama = get_renderer("llama3", tok)
    ex, ref = r.build_supervised_example(CONVO), llama.build_supervised_example(CONVO)
    assert ex.model_input.to_ints() == ref.model_input.to_ints()
    assert ex.weights.tolist() == ref.weights.tolist()
    custom = HFTemplateRenderer(tok, stop_tokens=["<|eot_id|>", "<|endoftext|>"])
    assert len(custom.get_stop_sequences()) == 2
    with pytest.raises(MissingSpecialTokenError, match=re.escape("<|eom_id|>")):
        HFTemplateRenderer(tok, stop_tokens=["<|eom_id|>"])


QWEN3_LIKE_TEMPLATE = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last and m.reasoning_content -%}"
    "{{ '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{{ m.content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def test_hf_template_rejects_templates_that_rewrite_history() -> None:
    r = get_renderer("hf_template", make_tokenizer(QWEN3_LIKE_TEMPLATE))
    thought: list[Message] = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "thinking": "two twos"},
    ]
    r.build_supervised_example(thought)  # fine: nothing comes after the thinking
    with pytest.raises(TemplateNotPrefixStableError, match="qwen3"):
        r.build_supervised_example([*thought, {"role": "user", "content": "more"}], TrainOnWhat.ALL_MESSAGES)


def test_hf_template_default_template_matches_chatml(tokenizer: PreTrainedTokenizerFast) -> None:
    assert tokenizer.chat_template == CHATML_TEMPLATE
    hf, chatml = get_renderer("hf_template", tokenizer), get_renderer("chatml", tokenizer)
    assert (
        hf.build_generation_prompt(CONVO[:4]).to_ints() == chatml.build_generation_prompt(CONVO[:4]).to_ints()
    )


def test_renderers_pickle(renderer: BaseRenderer) -> None:
    clone = pickle.loads(pickle.dumps(renderer))
    a = renderer.build_supervised_example(CONVO, TrainOnWhat.ALL_MESSAGES)
    b = clone.build_supervised_example(CONVO, TrainOnWhat.ALL_MESSAGES)
    assert a.model_input.to_ints() == b.model_input.to_ints()
    assert a.weights.tolist() == b.weights.tolist()


@pytest.mark.parametrize("name", ["chatml", "qwen3", "qwen3_instruct"])
def test_cookbook_message_format_renders_as_tempering_format(
    name: str, renderers: dict[str, BaseRenderer]
) -> None:
    """Content parts and ``{"function": …}`` tool calls render as ``thinking`` and ``{"name", …}`` do."""
    cookbook: list[Message] = [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},  # pyright: ignore[reportAssignmentType]
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "t"}, {"type": "text", "text": "a"}],  # pyright: ignore[reportAssignmentType]
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],  # pyright: ignore[reportAssignmentType]
        },
    ]
    tempering: list[Message] = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "a",
            "thinking": "t",
            "tool_calls": [{"name": "f", "arguments": "{}"}],
        },
    ]
    r = renderers[name]
    ours = r.build_supervised_example(tempering).model_input.to_ints()
    assert r.build_supervised_example(cookbook).model_input.to_ints() == ours
    assert '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>' in r.decode(ours)
