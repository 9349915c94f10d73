"""What the Kimi K2 renderers are built from: the format's markers and patterns, and messages read
into :class:`Turn` (see :mod:`tempering.renderers.kimi`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import cast

import attrs

from tempering.renderers._messages import read_tool_call
from tempering_protocols import Message

DEFAULT_SYSTEM_PROMPT = "You are Kimi, an AI assistant created by Moonshot AI."

ROLES = ("system", "user", "assistant", "tool", "tool_declare")
SECTION_OPEN, SECTION_CLOSE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_OPEN, CALL_ARGS, CALL_CLOSE = (
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
# The parser also accepts the singular section spelling some Kimi outputs use.
BLOCK_MARKERS = (
    (SECTION_OPEN, SECTION_CLOSE),
    ("<|tool_call_section_begin|>", "<|tool_call_section_end|>"),
    (CALL_OPEN, CALL_CLOSE),
)
SECTION_RE = re.compile(
    r"<\|tool_calls_section_begin\|>(.*?)<\|tool_calls_section_end\|>"
    r"|<\|tool_call_section_begin\|>(.*?)<\|tool_call_section_end\|>",
    re.DOTALL,
)
CALL_RE = re.compile(
    r"<\|tool_call_begin\|>\s*([^<]+:\d+)\s*<\|tool_call_argument_begin\|>\s*(.*?)\s*<\|tool_call_end\|>",
    re.DOTALL,
)
THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
UNPARSED_MAX_CHARS = 16384


# ------------------------------------------------------------------------------ input messages


@attrs.frozen
class CallFields:
    name: str
    arguments: str
    id: str | None


@attrs.frozen
class Turn:
    """A message reduced to what the Kimi format renders."""

    role: str
    text: str
    thinking: str
    calls: tuple[CallFields, ...]
    parts: tuple[str, ...] | None
    """A non-assistant message's content given as a list of text parts (rendered part by part)."""
    name: str
    tool_call_id: str


DEFAULT_SYSTEM = Turn("system", DEFAULT_SYSTEM_PROMPT, "", (), None, "system", "")


def where_of(index: int, role: str) -> str:
    return f"message {index} ({role})"


def read_tool_calls(message: Mapping[str, object], index: int, role: str) -> tuple[CallFields, ...]:
    """Tool calls in either format: ``{"name", "arguments", "id"?}`` or the OpenAI/cookbook
    ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
    raw = message.get("tool_calls")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise TypeError(f"{where_of(index, role)}: tool_calls is a {type(raw).__name__}, not a list")
    calls: list[CallFields] = []
    for k, item in enumerate(cast("list[object]", raw)):
        call = read_tool_call(item, f"{where_of(index, role)}: tool call {k}")
        calls.append(CallFields(call["name"], call["arguments"], call.get("id") or None))
    return tuple(calls)


def read_turn(message: Mapping[str, object], index: int, *, multipart: bool) -> Turn:
    """Normalize one message (tempering's or the cookbook's format), checking what Kimi can render.

    ``multipart``: whether a non-assistant message may give its content as several text parts
    (K2.5 renders them one by one; K2 takes a single text part only).
    """
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise ValueError(
            f"message {index} has role {role!r}; the Kimi format renders {', '.join(ROLES)} messages"
        )
    content = message.get("content")
    thinking_field = message.get("thinking") or ""
    if not isinstance(thinking_field, str):
        raise TypeError(f"{where_of(index, role)}: thinking is a {type(thinking_field).__name__}, not a str")
    texts: list[str] = []
    thoughts: list[str] = [thinking_field] if thinking_field else []
    parts: tuple[str, ...] | None = None
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for k, item in enumerate(cast("list[object]", content)):
            part = cast("Mapping[str, object]", item) if isinstance(item, Mapping) else {}
            kind = part.get("type")
            value = part.get(kind) if isinstance(kind, str) else None
            if kind not in ("text", "thinking") or not isinstance(value, str):
                raise ValueError(
                    f"{where_of(index, role)}: content part {k} is not a text or thinking part; the Kimi "
                    "text renderers refuse images and other media (they need a multimodal renderer)"
                )
            (texts if kind == "text" else thoughts).append(value)
        if role != "assistant" and not thoughts:
            parts = tuple(texts)
    else:
        raise TypeError(f"{where_of(index, role)}: content is a {type(content).__name__}, not str or a list")
    calls = read_tool_calls(message, index, role)
    if role != "assistant":
        if thoughts:
            raise ValueError(f"{where_of(index, role)} has thinking; only assistant messages carry reasoning")
        if calls:
            raise ValueError(f"{where_of(index, role)} has tool_calls; only assistants call tools")
        if parts is not None and len(parts) == 1:
            parts = None
        if parts is not None and not multipart:
            raise ValueError(
                f"{where_of(index, role)} has {len(parts)} content parts; this Kimi renderer renders a "
                "non-assistant message from one text part only (join them into one string)"
            )
    name = message.get("name") or ""
    tool_call_id = message.get("tool_call_id") or ""
    if not isinstance(name, str) or not isinstance(tool_call_id, str):
        raise TypeError(f"{where_of(index, role)}: name and tool_call_id are strings")
    if role == "tool" and not tool_call_id:
        raise ValueError(
            f"{where_of(index, role)} has no tool_call_id: Kimi heads a tool result with "
            "'## Return of <tool_call_id>', the id of the call it answers"
        )
    return Turn(role, "".join(texts), "".join(thoughts), calls, parts, name or "tool", tool_call_id)


def default_system_at(messages: Sequence[Message]) -> int | None:
    """Where Kimi's template puts the default system message, ``None`` if the conversation has
    its own: a system message comes first, or right after a leading ``tool_declare`` message."""
    first = messages[0].get("role") if messages else None
    if first == "tool_declare":
        return None if len(messages) > 1 and messages[1].get("role") == "system" else 1
    return None if first == "system" else 0


def with_default_system(messages: Sequence[Message]) -> list[Message]:
    """The conversation as Kimi's template sees it, the default system message added if due."""
    out = list(messages)
    at = default_system_at(messages)
    if at is not None:
        out.insert(at, Message(role="system", content=DEFAULT_SYSTEM_PROMPT))
    return out


def first_turn_index(messages: Sequence[Message]) -> int:
    """After the last assistant message that called no tool (0 if none): the produced turn."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "assistant" and not messages[i].get("tool_calls"):
            return i + 1
    return 0
