"""Renderers turn chat messages into tokens and sampled tokens back into messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import tinker

from tempering_protocols.types import Message, StopCondition, SupervisedExample, TrainOnWhat

__all__ = ["Renderer", "Tokenizer", "decode_text"]


@runtime_checkable
class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer that tempering uses.

    ``decode`` is typed as Hugging Face types it (a batch of sequences decodes to a list);
    use :func:`decode_text` to get a ``str`` for one sequence.
    """

    def encode(self, text: str, /, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], /) -> str | list[str]: ...


def decode_text(tokenizer: Tokenizer, token_ids: Sequence[int], /) -> str:
    """Decode one token sequence to text."""
    text = tokenizer.decode(list(token_ids))
    if not isinstance(text, str):
        raise TypeError(f"tokenizer.decode returned {type(text).__name__} for one sequence, not str")
    return text


@runtime_checkable
class Renderer(Protocol):
    """Messages <-> tokens for one chat format.

    Example::

        prompt = renderer.build_generation_prompt(messages)
        example = renderer.build_supervised_example(messages, TrainOnWhat.ALL_ASSISTANT_MESSAGES)
        message, ok = renderer.parse_response(sampled_tokens)
    """

    def build_generation_prompt(self, messages: Sequence[Message], /) -> tinker.ModelInput:
        """Tokens that prompt the model for the next assistant message."""
        ...

    def build_supervised_example(
        self,
        messages: Sequence[Message],
        train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        /,
    ) -> SupervisedExample:
        """Tokens of the whole conversation and a weight per token."""
        ...

    def get_stop_sequences(self) -> StopCondition:
        """What ends an assistant message when sampling."""
        ...

    def parse_response(self, tokens: Sequence[int], /) -> tuple[Message, bool]:
        """The assistant message in sampled tokens, and whether it parsed cleanly."""
        ...
