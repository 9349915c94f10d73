"""Batch tokenization of text pieces: special tokens in text stay text (re-exported by
:mod:`tempering.renderers._base`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, cast

from tempering_protocols import Tokenizer


class BackendTokenizer(Protocol):
    def encode_batch_fast(self, inputs: list[str], add_special_tokens: bool = ...) -> list[Encoding]: ...


class Encoding(Protocol):
    @property
    def ids(self) -> list[int]: ...


def text_encoder(tokenizer: Tokenizer) -> Callable[[Sequence[str]], list[list[int]]]:
    """A batch encoder for text pieces: special tokens in the text are tokenized as text.

    For a Hugging Face fast tokenizer this is a copy of its Rust backend with
    ``encode_special_tokens`` set, called once per batch (``encode_batch_fast``). Special tokens
    (``<|im_end|>``) therefore never come out of a text piece: a renderer gives them as ids,
    and a user's content that happens to contain one is tokenized as the characters it is.
    Added tokens that are not special (Qwen's ``<think>``) are still matched, as the tokenizer
    matches them. Any other :class:`Tokenizer` is called text by text.
    """
    backend = cast("object", getattr(tokenizer, "backend_tokenizer", None))
    if backend is not None and hasattr(backend, "to_str") and hasattr(backend, "encode_batch_fast"):
        from tokenizers import Tokenizer as RustTokenizer

        copy = RustTokenizer.from_str(cast("RustTokenizer", backend).to_str())
        copy.encode_special_tokens = True
        fast = cast("BackendTokenizer", copy)

        def encode_fast(texts: Sequence[str]) -> list[list[int]]:
            if not texts:
                return []
            return [e.ids for e in fast.encode_batch_fast(list(texts), add_special_tokens=False)]

        return encode_fast

    def encode_each(texts: Sequence[str]) -> list[list[int]]:
        return [list(tokenizer.encode(text, add_special_tokens=False)) for text in texts]

    return encode_each


def encode_batch(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Tokenize many texts without special tokens, through the tokenizer's batch path.

    Hugging Face tokenizers are called once on the whole list (the Rust backend encodes the
    batch in parallel); any other :class:`Tokenizer` is called text by text.

    Example::

        encode_batch(tokenizer, ["user\\n", "What is 2+2?"])  # [[882, 198], [3923, 374, ...]]
    """
    if not texts:
        return []
    if callable(tokenizer):
        call = cast("Callable[..., object]", tokenizer)
        out = call(list(texts), add_special_tokens=False)
        ids = out.get("input_ids") if isinstance(out, Mapping) else getattr(out, "input_ids", None)
        if isinstance(ids, list) and len(ids) == len(texts):
            return [list(cast("Iterable[int]", row)) for row in cast("list[object]", ids)]
    return [list(tokenizer.encode(text, add_special_tokens=False)) for text in texts]
