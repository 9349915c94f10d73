"""Test tokenizers built in memory: byte-level BPE with every format's special tokens.

No network and no model download: the vocabulary is the 256 ByteLevel symbols plus a few merges
(so that tokenizing a concatenated string can differ from concatenating token lists, as with
real BPE tokenizers), and the special tokens of every chat format tempering renders.
"""

from __future__ import annotations

import functools

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SHARED_TOKENIZER_NAMES = (
    "chatml",
    "hf_template",
    "llama3",
    "qwen3",
    "qwen3_disable_thinking",
    "qwen3_instruct",
    "role_colon",
    "smollm2",
)
"""The formats whose special tokens this module's tokenizer has. The other registry names are
tested against the Tinker Cookbook, each with its own family's tokenizer
(test_renderer_reference.py)."""

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""The pre-tokenizer split of Llama 3 (and, digits aside, Qwen2/3): a run of newlines is one
pre-token whatever follows it, as in the real tokenizers (GPT-2's split would cut ``"\n\n4"``
into ``"\n"``, ``"\n"``, ``"4"`` and make a prompt ending in ``"\n\n"`` no prefix of its turn)."""


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
# Qwen3 ships these as added (not special) tokens: they are single ids but decode as text.
ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

# Merges that cross the boundaries renderers put between parts ("\n\n", ": ", " 4" …).
_MERGES = [
    ("Ċ", "Ċ"),
    ("Ġ", "Ġ"),
    (":", "Ġ"),
    ("Ġ", "4"),
    ("e", "r"),
    ("Ġ", "t"),
    ("t", "h"),
    ("Ġt", "h"),
    ("U", "s"),
    ("Us", "er"),
    ("a", "n"),
    ("i", "n"),
    ("o", "n"),
    ("?", "Ċ"),
]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def _backend(added_tokens: tuple[str, ...] = tuple(ADDED_TOKENS)) -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab: dict[str, int] = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for a, b in _MERGES:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(_MERGES)))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens(list(added_tokens))
    return tok


@functools.cache
def _backend_json(added_tokens: tuple[str, ...]) -> str:
    return _backend(added_tokens).to_str()


def make_tokenizer(
    chat_template: str | None = CHATML_TEMPLATE,
    eos_token: str = "<|im_end|>",
    added_tokens: tuple[str, ...] = tuple(ADDED_TOKENS),
) -> PreTrainedTokenizerFast:
    """A fresh byte-level tokenizer with every special token and the given chat template."""
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_backend_json(added_tokens)),
        bos_token="<|begin_of_text|>",
        eos_token=eos_token,
        pad_token="<|endoftext|>",
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
    )


def make_plain_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with no special tokens at all."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)
