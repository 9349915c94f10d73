"""Conversations as renderers read them: runtime checks of the messages, one-line descriptions for
error messages, and each message's weight under a ``train_on_what`` (re-exported by
:mod:`tempering.renderers._base`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import cast

from tempering_protocols import Message, TrainOnWhat


def content_preview(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", p.get("thinking", "")))
            for p in cast("list[object]", content)
            if isinstance(p, dict)
            for p in [cast("dict[str, object]", p)]
        )
    return repr(content)


def describe_conversation(messages: Sequence[Message], limit: int = 200) -> str:
    """A short, one-line description of a conversation for error messages.

    Example::

        describe_conversation([{"role": "user", "content": "What is 2+2?"}])
        # "[user: 'What is 2+2?']"
    """
    parts: list[str] = []
    for m in messages:
        content = content_preview(cast("object", m.get("content", "")))
        text = content if len(content) <= 40 else content[:37] + "..."
        parts.append(f"{m.get('role', '?')}: {text!r}")
    out = "[" + ", ".join(parts) + "]"
    return out if len(out) <= limit else out[: limit - 4] + "...]"


PART_KINDS = ("text", "thinking")


def check_content(content: object, index: int, role: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise TypeError(
            f"message {index} ({role}) has content of type {type(content).__name__}, "
            "not str or a list of parts"
        )
    for k, part in enumerate(cast("list[object]", content)):
        if not isinstance(part, Mapping):
            raise TypeError(
                f"message {index} ({role}): content part {k} is a {type(part).__name__}, not a dict"
            )
        p = cast("Mapping[str, object]", part)
        kind = p.get("type")
        if kind not in PART_KINDS:
            raise ValueError(
                f"message {index} ({role}): content part {k} has type {kind!r}; text renderers read "
                "'text' and 'thinking' parts (images and audio need a multimodal renderer)"
            )
        value = p.get(str(kind))
        if not isinstance(value, str):
            raise TypeError(f"message {index} ({role}): content part {k} ({kind}) has no str {kind!r} field")


def check_messages(messages: object, *, allow_empty: bool) -> None:
    """Messages are checked at runtime: they often come straight from JSON."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"a conversation is a sequence of messages, got {type(messages).__name__}")
    items = cast("Sequence[object]", messages)
    if not items and not allow_empty:
        raise ValueError("empty conversation: there is nothing to render")
    for i, m in enumerate(items):
        if not isinstance(m, Mapping):
            raise TypeError(f"message {i} is a {type(m).__name__}, not a mapping with role and content")
        msg = cast("Mapping[str, object]", m)
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"message {i} has no role (a non-empty string): {msg!r:.120}")
        check_content(msg.get("content"), i, role)


def message_weight(message: Message, index: int) -> float:
    trainable = cast("object", message.get("trainable"))
    if trainable is not None:
        if not isinstance(trainable, bool):
            raise TypeError(f"message {index} has trainable={trainable!r}; it is a bool")
        return float(trainable)
    weight: object = message.get("weight", 0.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"message {index} has weight {weight!r}; customized weights are finite numbers")
    return float(weight)


def last_user_index(messages: Sequence[Message]) -> int:
    """Index of the last user message, ``-1`` if there is none."""
    return max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)


def message_weights(
    messages: Sequence[Message], train_on_what: TrainOnWhat, *, turn_start: int | None = None
) -> list[float]:
    """The weight of each message's completion tokens under ``train_on_what``.

    Headers get weight 0 in every mode but ``ALL_TOKENS``. ``turn_start`` is where the last
    assistant turn starts (default: after the last user message among all but the last
    message, as the Tinker Cookbook counts it for a supervised example).

    Example::

        message_weights(convo, TrainOnWhat.ALL_ASSISTANT_MESSAGES)  # [0.0, 1.0, 0.0, 1.0]
    """
    n = len(messages)
    roles = [m["role"] for m in messages]
    if train_on_what != TrainOnWhat.CUSTOMIZED:
        for i, m in enumerate(messages):
            if "trainable" in m:
                raise ValueError(
                    f"message {i} ({roles[i]}) has a 'trainable' flag, which only "
                    f"train_on_what=customized reads (this is {train_on_what.value}); "
                    "use customized or drop the flag"
                )
    if train_on_what in (TrainOnWhat.ALL_MESSAGES, TrainOnWhat.ALL_TOKENS):
        return [1.0] * n
    if train_on_what == TrainOnWhat.ALL_ASSISTANT_MESSAGES:
        return [float(r == "assistant") for r in roles]
    if train_on_what == TrainOnWhat.ALL_USER_AND_SYSTEM_MESSAGES:
        return [float(r in ("user", "system")) for r in roles]
    if train_on_what == TrainOnWhat.LAST_ASSISTANT_MESSAGE:
        return [float(i == n - 1 and r == "assistant") for i, r in enumerate(roles)]
    if train_on_what == TrainOnWhat.LAST_ASSISTANT_TURN:
        start = last_user_index(messages[:-1]) + 1 if turn_start is None else turn_start
        return [float(i >= start and r == "assistant") for i, r in enumerate(roles)]
    if train_on_what == TrainOnWhat.CUSTOMIZED:
        return [message_weight(m, i) for i, m in enumerate(messages)]
    raise ValueError(f"unknown train_on_what: {train_on_what!r}")
