"""What the DeepSeek V3.1 and V4.1 renderers share: the format's markers, messages read into
:class:`Turn`, and the parsing helpers (see :mod:`tempering.renderers.deepseek`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import cast

import attrs

from tempering.renderers._messages import read_tool_call
from tempering_protocols import Message, ToolCall

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT, SYSTEM = "<｜User｜>", "<｜Assistant｜>", "<｜System｜>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, CALL_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
OUTPUT_BEGIN, OUTPUT_END = "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"
DSML = "｜DSML｜"

DETAIL_MAX_CHARS = 16384
"""How much of a dangling tool block an ``unparsed_tool_calls`` entry keeps (as the cookbook)."""

THINK_BLOCK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)


# ----------------------------------------------------------------------------- input messages


@attrs.frozen
class Turn:
    """A message read from either message format.

    ``parts`` is the content as ``(kind, text)`` parts when it was given as parts (or with a
    ``thinking`` field, which is a thinking part before the text); ``None`` when it was a plain
    string, which both formats render verbatim (``<think>`` in a string is not parsed).
    """

    index: int
    role: str
    text: str
    parts: tuple[tuple[str, str], ...] | None
    calls: tuple[ToolCall, ...]
    call_id: str | None
    declared: str = ""
    """Markup the format writes after the text (V4.1's tools section in the system turn): its
    ``｜DSML｜`` markers are the format's tokens, where the text's are the user's characters."""

    @property
    def where(self) -> str:
        return f"message {self.index} ({self.role})"

    @property
    def has_content(self) -> bool:
        """The cookbook's ``bool(message["content"])``: a part list is truthy even if its text is empty."""
        return bool(self.parts) if self.parts is not None else bool(self.text)

    @property
    def has_thinking(self) -> bool:
        """The cookbook's ``has_thinking``: a thinking part, or ``<think>`` in a string."""
        if self.parts is not None:
            return any(kind == "thinking" for kind, _ in self.parts)
        return THINK_OPEN in self.text

    @property
    def reasoning(self) -> str:
        return "".join(v for k, v in self.parts if k == "thinking") if self.parts is not None else ""

    @property
    def answer(self) -> str:
        return "".join(v for k, v in self.parts if k == "text") if self.parts is not None else self.text

    def plain(self) -> str:
        """The content as text; a message with thinking or several parts is refused (``ensure_text``)."""
        if self.parts is None:
            return self.text
        if len(self.parts) == 1 and self.parts[0][0] == "text":
            return self.parts[0][1]
        raise ValueError(
            f"{self.where} must be plain text here, but it has {len(self.parts)} content parts "
            f"({', '.join(k for k, _ in self.parts) or 'none'}); only assistant messages carry thinking"
        )


def read_turn(message: Message, index: int) -> Turn:
    """Read one message (its content was checked by the base: a str or text/thinking parts)."""
    role = message["role"]
    where = f"message {index} ({role})"
    content = cast("object", message["content"])
    parts: list[tuple[str, str]] | None = None
    text = ""
    if isinstance(content, str):
        text = content
    else:
        parts = []
        for part in cast("list[Mapping[str, str]]", content):
            kind = part["type"]
            parts.append((kind, part[kind]))
    thinking = cast("object", message.get("thinking"))
    if thinking is not None:
        if not isinstance(thinking, str):
            raise TypeError(f"{where} has thinking of type {type(thinking).__name__}, not str")
        parts = [("thinking", thinking), *(parts if parts is not None else [("text", text)])]
    if parts is not None:
        text = "".join(v for k, v in parts if k == "text")
    raw_calls = cast("object", message.get("tool_calls"))
    calls: tuple[ToolCall, ...] = ()
    if raw_calls is not None:
        if not isinstance(raw_calls, list):
            raise TypeError(f"{where} has tool_calls of type {type(raw_calls).__name__}, not a list")
        calls = tuple(read_tool_call(c, where) for c in cast("list[object]", raw_calls))
        if calls and role != "assistant":
            raise ValueError(f"{where} has tool_calls; only assistant messages call tools")
    call_id = cast("object", message.get("tool_call_id"))
    if call_id is not None and not isinstance(call_id, str):
        raise TypeError(f"{where} has tool_call_id {call_id!r}, not a str")
    return Turn(index, role, text, None if parts is None else tuple(parts), calls, call_id)


def read_turns(messages: Sequence[Message]) -> list[Turn]:
    return [read_turn(m, i) for i, m in enumerate(messages)]
