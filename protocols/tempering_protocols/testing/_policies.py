"""Conformance checks for ``TokenCompleter`` and ``MessageCompleter``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import numpy as np
import tinker
from typeguard import CollectionCheckStrategy, TypeCheckError, check_type

from tempering_protocols.policies import MessageCompleter, TokenCompleter
from tempering_protocols.testing._base import (
    STOP_CONDITION_TYPE,
    ConformanceError,
    acall,
    expect_type,
    name_of,
    run_sync,
)
from tempering_protocols.testing._structure import check_object_implements
from tempering_protocols.types import Message, StopCondition, TokensWithLogprobs

__all__ = [
    "acheck_message_completer",
    "acheck_token_completer",
    "check_message_completer",
    "check_token_completer",
]


def _is_stop_condition(value: object) -> bool:
    try:
        check_type(value, STOP_CONDITION_TYPE, collection_check_strategy=CollectionCheckStrategy.ALL_ITEMS)
    except TypeCheckError:
        return False
    return True


_LOGPROB_TOLERANCE = 1e-4
"""Logprobs are <= 0; samplers computing in low precision may overshoot 0 by a little."""


def _token_count(tokens: object, what: str) -> int:
    if isinstance(tokens, np.ndarray):
        array = cast(np.ndarray[tuple[int, ...], np.dtype[np.generic]], tokens)
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise ConformanceError(
                "completer/return-type",
                f"{what}: tokens must be a 1-D integer array, got shape {array.shape} dtype {array.dtype}",
            )
        return int(array.shape[0])
    expect_type(tokens, Sequence[int], rule="completer/return-type", what=f"{what}: tokens must be ints")
    return len(cast(Sequence[int], tokens))


def _logprob_values(logprobs: object, what: str) -> list[float]:
    if isinstance(logprobs, np.ndarray):
        array = cast(np.ndarray[tuple[int, ...], np.dtype[np.generic]], logprobs)
        if array.ndim != 1 or array.dtype.kind != "f":
            raise ConformanceError(
                "completer/return-type",
                f"{what}: logprobs must be a 1-D float array, got shape {array.shape} dtype {array.dtype}",
            )
        return [float(x) for x in array.tolist()]
    expect_type(
        logprobs, Sequence[float], rule="completer/return-type", what=f"{what}: logprobs must be floats"
    )
    return [float(x) for x in cast(Sequence[float], logprobs)]


async def acheck_token_completer(
    completer: object,
    /,
    *,
    prompt: tinker.ModelInput | None = None,
    stop: StopCondition | None = None,
    require_logprobs: bool = True,
) -> TokensWithLogprobs:
    """Async variant of :func:`check_token_completer`.

    Example::

        sampled = await acheck_token_completer(my_policy)
    """
    name = name_of(completer)
    check_object_implements(completer, TokenCompleter)
    the_completer = cast(TokenCompleter, completer)
    model_input = tinker.ModelInput.from_ints([1, 2, 3]) if prompt is None else prompt
    stop_condition: StopCondition = [0] if stop is None else stop
    if not _is_stop_condition(stop_condition):
        raise TypeError(f"stop must be list[str] or list[int], got {stop_condition!r}")
    what = f"{name}(model_input, {stop_condition!r})"
    result = await acall("completer/raised", what, lambda: the_completer(model_input, stop_condition))
    expect_type(
        result,
        TokensWithLogprobs,
        rule="completer/return-type",
        what=f"{what} must return TokensWithLogprobs",
    )
    sampled = result
    expect_type(
        sampled.stop_reason,
        str,
        rule="completer/return-type",
        what=f"{what}: stop_reason must be 'stop' or 'length'",
    )
    if sampled.stop_reason not in ("stop", "length"):
        raise ConformanceError(
            "completer/return-type",
            f"{what}: stop_reason must be 'stop' or 'length', got {sampled.stop_reason!r}",
        )
    n_tokens = _token_count(sampled.tokens, what)
    if sampled.maybe_logprobs is None:
        if require_logprobs:
            raise ConformanceError(
                "completer/missing-logprobs",
                f"{what} returned no logprobs (maybe_logprobs is None); RL needs the sampler's logprobs",
            )
        return sampled
    logprobs = _logprob_values(sampled.maybe_logprobs, what)
    if len(logprobs) != n_tokens:
        raise ConformanceError(
            "completer/logprobs-length",
            f"{what} returned {n_tokens} tokens but {len(logprobs)} logprobs; there must be one per token",
        )
    if not all(math.isfinite(x) and x <= _LOGPROB_TOLERANCE for x in logprobs):
        raise ConformanceError(
            "completer/logprobs-range",
            f"{what} returned logprobs that are not finite and <= 0: {logprobs[:8]}",
        )
    return sampled


def check_token_completer(
    completer: object,
    /,
    *,
    prompt: tinker.ModelInput | None = None,
    stop: StopCondition | None = None,
    require_logprobs: bool = True,
) -> TokensWithLogprobs:
    """Sample once from a ``TokenCompleter`` and check what it returns; return the sample.

    ``prompt`` defaults to tokens ``[1, 2, 3]`` and ``stop`` to ``[0]``. The result must be a
    ``TokensWithLogprobs`` with integer tokens (a list or a 1-D integer array), a valid
    ``stop_reason``, and, unless ``require_logprobs=False``, one finite logprob <= 0 per token.
    Rules: ``completer/return-type``, ``completer/missing-logprobs``,
    ``completer/logprobs-length``, ``completer/logprobs-range``, ``completer/raised``.

    Example::

        sampled = check_token_completer(my_policy, stop=[tokenizer.eos_token_id])
    """
    return run_sync(
        acheck_token_completer(completer, prompt=prompt, stop=stop, require_logprobs=require_logprobs),
        "check_token_completer",
    )


_DEFAULT_QUESTION: tuple[Message, ...] = ({"role": "user", "content": "What is 2 + 2?"},)


async def acheck_message_completer(
    completer: object, /, *, messages: Sequence[Message] = _DEFAULT_QUESTION
) -> Message:
    """Async variant of :func:`check_message_completer`.

    Example::

        reply = await acheck_message_completer(my_completer)
    """
    name = name_of(completer)
    check_object_implements(completer, MessageCompleter)
    the_completer = cast(MessageCompleter, completer)
    what = f"{name}(messages)"
    reply = await acall("message-completer/raised", what, lambda: the_completer(messages))
    expect_type(reply, Message, rule="message-completer/return-type", what=f"{what} must return a Message")
    if reply["role"] != "assistant":
        raise ConformanceError(
            "message-completer/return-type",
            f"{what} returned a message with role {reply['role']!r}, not 'assistant'",
        )
    return reply


def check_message_completer(
    completer: object, /, *, messages: Sequence[Message] = _DEFAULT_QUESTION
) -> Message:
    """Ask a ``MessageCompleter`` one question and check it answers with an assistant ``Message``.

    Rules: ``message-completer/return-type``, ``message-completer/raised``.

    Example::

        reply = check_message_completer(my_completer)
    """
    return run_sync(acheck_message_completer(completer, messages=messages), "check_message_completer")
