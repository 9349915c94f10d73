"""Row shapes: a chat row is ``{"messages": [...]}``; a preference row holds a prompt and two completions."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TypeAlias, cast

from tempering.data._rows import RowError
from tempering.data.jsontext import JSONNestingError, loads_bounded
from tempering_protocols import Comparison, LabeledComparison, Message, ToolCall

__all__ = ["ROLES", "Conversation", "parse_chat_row", "parse_comparison_row", "parse_messages"]

Conversation: TypeAlias = list[Message]
"""One chat: its messages in order."""

ROLES = frozenset({"system", "user", "assistant", "tool"})
"""The roles a message may have."""

_LABELS = ("A", "B", "Tie")


def _type(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _tool_call(value: object, where: str) -> ToolCall:
    """``{"name", "arguments"}``, or OpenAI's ``{"type": "function", "function": {...}}``.

    Arguments may be JSON text or an object (stored as JSON text).
    """
    if not isinstance(value, Mapping):
        raise RowError(f"{where} is a {_type(value)}, not an object")
    outer = cast("Mapping[str, object]", value)
    call = outer
    function = outer.get("function")
    if isinstance(function, Mapping):
        call = cast("Mapping[str, object]", function)
    name, arguments = call.get("name"), call.get("arguments")
    if not isinstance(name, str) or not name:
        raise RowError(f"{where} has no name (a non-empty string)")
    if isinstance(arguments, Mapping):
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not isinstance(arguments, str):
        raise RowError(f"{where} ({name}) has arguments of type {_type(arguments)}, not a JSON object")
    try:
        decoded: object = loads_bounded(arguments)
    except (json.JSONDecodeError, JSONNestingError):
        decoded = None
    if not isinstance(decoded, dict):
        raise RowError(f"{where} ({name}) has arguments that are not a JSON object: {arguments!r:.60}")
    out = ToolCall(name=name, arguments=arguments)
    call_id = outer.get("id", call.get("id"))
    if isinstance(call_id, str):
        out["id"] = call_id
    return out


def _content_parts(parts: list[object], index: int, role: str) -> tuple[str, str | None]:
    """The Tinker Cookbook's list content: ``thinking`` parts, then ``text`` parts.

    Returns ``(text, thinking or None)``, each the parts' strings joined. Parts in another order
    (text before thinking), and images, are refused: tempering's text renderers write the
    thinking block before the text.
    """
    texts: list[str] = []
    thoughts: list[str] = []
    for k, part in enumerate(parts):
        where = f"message {index} ({role}), content part {k}"
        if not isinstance(part, Mapping):
            raise RowError(f"{where} is a {_type(part)}, not an object with a type")
        p = cast("Mapping[str, object]", part)
        kind = p.get("type")
        if kind not in ("text", "thinking"):
            raise RowError(f"{where} has type {kind!r}; text renderers read 'text' and 'thinking' parts")
        value = p.get(str(kind))
        if not isinstance(value, str):
            raise RowError(f"{where} ({kind}) has no string {kind!r} field")
        if kind == "thinking" and texts:
            raise RowError(f"{where}: a thinking part after a text part (thinking comes first)")
        (thoughts if kind == "thinking" else texts).append(value)
    return "".join(texts), ("".join(thoughts) if thoughts else None)


def _message(value: object, index: int) -> Message:
    if not isinstance(value, Mapping):
        raise RowError(f"message {index} is a {_type(value)}, not an object with role and content")
    raw = cast("Mapping[str, object]", value)
    role, content = raw.get("role"), raw.get("content")
    if role is None:
        raise RowError(f"message {index} has no role")
    if not isinstance(role, str) or role not in ROLES:
        raise RowError(f"message {index} has role {role!r}; roles are {', '.join(sorted(ROLES))}")
    if content is None and raw.get("tool_calls"):
        content = ""  # OpenAI writes null content beside tool calls
    thinking: str | None = None
    if isinstance(content, list):
        content, thinking = _content_parts(cast("list[object]", content), index, role)
    if not isinstance(content, str):
        what = "no content" if content is None else f"content of type {_type(content)}, not a string"
        raise RowError(f"message {index} ({role}) has {what}")
    message = Message(role=role, content=content)
    if thinking is not None:
        message["thinking"] = thinking
    for key in ("thinking", "tool_call_id", "name"):
        extra = raw.get(key)
        if extra is None:
            continue
        if not isinstance(extra, str):
            raise RowError(f"message {index} ({role}) has {key} of type {_type(extra)}, not a string")
        message[key] = extra
    calls = raw.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise RowError(f"message {index} ({role}) has tool_calls of type {_type(calls)}, not a list")
        items = cast("list[object]", calls)
        if items:
            message["tool_calls"] = [
                _tool_call(c, f"tool call {k} of message {index}") for k, c in enumerate(items)
            ]
    trainable = raw.get("trainable")
    if trainable is not None:
        if not isinstance(trainable, bool):
            raise RowError(f"message {index} ({role}) has trainable {trainable!r}, not true or false")
        message["trainable"] = trainable
    weight = raw.get("weight")
    if weight is not None:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise RowError(f"message {index} ({role}) has weight {weight!r}, not a finite number")
        message["weight"] = float(weight)
    return message


def parse_messages(value: object, what: str = "messages") -> Conversation:
    """A non-empty list of messages, checked; optional keys set to null are dropped.

    Example::

        parse_messages([{"role": "user", "content": "hi"}])  # [{"role": "user", "content": "hi"}]
    """
    if not isinstance(value, list):
        raise RowError(f"{what} is a {_type(value)}, not a list of messages")
    items = cast("list[object]", value)
    if not items:
        raise RowError(f"empty conversation: {what} is []")
    return [_message(m, i) for i, m in enumerate(items)]


def parse_chat_row(row: object) -> Conversation:
    """The conversation in a ``{"messages": [...]}`` row.

    Example::

        parse_chat_row({"messages": [{"role": "user", "content": "2+2?"},
                                     {"role": "assistant", "content": "4"}]})
    """
    if not isinstance(row, Mapping):
        raise RowError(f'a row is an object with "messages", not a {_type(row)}')
    fields = cast("Mapping[str, object]", row)
    if "messages" not in fields:
        raise RowError(f'no "messages" field (fields: {", ".join(sorted(map(str, fields))) or "none"})')
    return parse_messages(fields["messages"])


def _turns(value: object, what: str, default_role: str) -> Conversation:
    """A list of messages, or a plain string (one message with ``default_role``)."""
    if isinstance(value, str):
        return [Message(role=default_role, content=value)]
    return parse_messages(value, what)


def parse_comparison_row(row: object) -> LabeledComparison:
    """A labeled comparison from a preference row.

    Two shapes are read:

    - ``{"prompt_conversation": [...], "completion_A": [...], "completion_B": [...], "label": "A"}``
      (``label`` is ``"A"``, ``"B"`` or ``"Tie"``);
    - ``{"prompt": [...], "chosen": [...], "rejected": [...]}``: the chosen completion is A.

    Completions may be a string (one assistant message) and a prompt a string (one user message).

    Example::

        parse_comparison_row({"prompt": "2+2?", "chosen": "4", "rejected": "5"}).label  # "A"
    """
    if not isinstance(row, Mapping):
        raise RowError(f"a preference row is an object, not a {_type(row)}")
    fields = cast("Mapping[str, object]", row)
    if "chosen" in fields or "rejected" in fields:
        keys, label = ("prompt", "chosen", "rejected"), "A"
    else:
        keys = ("prompt_conversation", "completion_A", "completion_B")
        label = fields.get("label")
        if label not in _LABELS:
            raise RowError(f'label is {label!r}; labels are "A", "B" or "Tie"')
    missing = [k for k in keys if k not in fields]
    if missing:
        raise RowError(f"missing field(s) {', '.join(missing)}")
    prompt = _turns(fields[keys[0]], keys[0], "user")
    completion_A = _turns(fields[keys[1]], keys[1], "assistant")
    completion_B = _turns(fields[keys[2]], keys[2], "assistant")
    return LabeledComparison(
        comparison=Comparison(prompt, completion_A, completion_B),
        label=label,
    )
