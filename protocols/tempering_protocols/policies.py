"""Policies: what plays an environment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tempering_protocols.types import Message, Observation, StopCondition, TokensWithLogprobs

__all__ = ["MessageCompleter", "TokenCompleter"]


@runtime_checkable
class TokenCompleter(Protocol):
    """Samples an action for a token-level observation.

    Example::

        ac = await policy(tinker.ModelInput.from_ints(prompt), [eos_id])
        ac.tokens, ac.logprobs
    """

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs: ...


@runtime_checkable
class MessageCompleter(Protocol):
    """Answers a conversation with one message.

    Example::

        reply = await completer([{"role": "user", "content": "2+2?"}])
    """

    async def __call__(self, messages: Sequence[Message], /) -> Message: ...
