"""What the Nemotron 3 renderers are built from: the format's control tokens and tool texts,
messages read into :class:`Turn`, tool declarations and response parsing (see
:mod:`tempering.renderers.nemotron`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Literal, TypeAlias, cast

import attrs

from tempering.renderers._messages import (
    DETAIL_MAX_CHARS,
    THINK_OR_TOOL_RE,
    UNTERMINATED,
    json_tool_call,
    tool_call_arguments,
    tool_call_fields,
    xml_function_call,
)
from tempering.renderers._text import assistant_message
from tempering_protocols import Message, ToolCall

ROLES = ("system", "user", "assistant", "tool")
CONTROL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
"""Markup the format writes that a Nemotron tokenizer may hold as single (special) tokens."""


TOOLS_INSTRUCTIONS = (
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n"
    "<function=example_function_name>\n"
    "<parameter=example_parameter_1>\n"
    "value_1\n"
    "</parameter>\n"
    "<parameter=example_parameter_2>\n"
    "This is the value for the second parameter\n"
    "that can span\n"
    "multiple lines\n"
    "</parameter>\n"
    "</function>\n"
    "</tool_call>\n\n"
    "<IMPORTANT>\n"
    "Reminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block "
    "must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the "
    "function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>"
)

TOOLS_HEADER = "# Tools\n\nYou have access to the following functions:\n\n<tools>\n"

PartKind: TypeAlias = Literal["text", "thinking"]


# ------------------------------------------------------------------------------ input messages


@attrs.frozen
class ToolCallFields:
    name: str
    arguments: dict[str, object]


@attrs.frozen
class Turn:
    """A message as the format sees it.

    ``content`` stays a ``str`` or a tuple of parts, because the template treats them
    differently: a string is trimmed, parts are not.
    """

    index: int
    """The caller's index of the message; -1 for the empty system message the format adds."""
    role: str
    content: str | tuple[tuple[PartKind, str], ...]
    calls: tuple[ToolCallFields, ...] | None
    """``None`` when the message has no ``tool_calls`` key (an empty list is still written)."""

    def where(self) -> str:
        return f"message {self.index} ({self.role})"

    @property
    def has_thinking(self) -> bool:
        """Thinking as the template asks: a thinking part, or ``<think>`` in string content."""
        if isinstance(self.content, str):
            return "<think>" in self.content
        return any(kind == "thinking" for kind, _ in self.content)

    @property
    def has_thinking_part(self) -> bool:
        return not isinstance(self.content, str) and any(kind == "thinking" for kind, _ in self.content)

    @property
    def has_nonempty_text_part(self) -> bool:
        return not isinstance(self.content, str) and any(kind == "text" and v for kind, v in self.content)


INJECTED_SYSTEM = Turn(index=-1, role="system", content="", calls=None)
EMPTY_SYSTEM_MESSAGE = Message(role="system", content="")


def injects_system(messages: Sequence[Message]) -> bool:
    """Nemotron's template writes a system turn even when the conversation has none."""
    return not messages or messages[0]["role"] != "system"


def read_call(raw: object, where: str) -> ToolCallFields:
    """A tool call in tempering's ``{"name", "arguments"}`` or the cookbook's ``{"function": …}`` form."""
    name, arguments = tool_call_fields(raw, where)
    return ToolCallFields(name, tool_call_arguments(arguments, where, name))


def read_turn(message: Message, index: int) -> Turn:
    raw = cast("Mapping[str, object]", message)
    role = message["role"]
    where = f"message {index} ({role})"
    if role not in ROLES:
        raise ValueError(f"{where}: the nemotron format has system, user, assistant and tool messages")
    content_obj = raw.get("content")
    parts: list[tuple[PartKind, str]] = []
    thinking = raw.get("thinking")
    if thinking is not None and not isinstance(thinking, str):
        raise TypeError(f"{where}: thinking is a {type(thinking).__name__}, not a str")
    if thinking:
        parts.append(("thinking", thinking))
    content: str | tuple[tuple[PartKind, str], ...]
    if isinstance(content_obj, str) and not parts:
        content = content_obj
    else:
        if isinstance(content_obj, str):
            parts.append(("text", content_obj))
        else:
            for p in cast("list[Mapping[str, object]]", content_obj):
                kind = cast("PartKind", p["type"])
                parts.append((kind, cast("str", p[kind])))
        content = tuple(parts)
    if role != "assistant" and any(kind == "thinking" for kind, _ in parts):
        raise ValueError(f"{where} has thinking; only assistant messages reason in the nemotron format")
    calls_obj = raw.get("tool_calls")
    calls: tuple[ToolCallFields, ...] | None = None
    if "tool_calls" in raw:
        if role != "assistant":
            raise ValueError(f"{where} has tool_calls; only assistants call tools")
        if not isinstance(calls_obj, list):
            raise TypeError(f"{where}: tool_calls is a {type(calls_obj).__name__}, not a list")
        calls = tuple(read_call(c, where) for c in cast("list[object]", calls_obj))
    return Turn(index=index, role=role, content=content, calls=calls)


def argument_text(value: object) -> str:
    """A tool-call argument as the template writes it: JSON for objects and lists, ``str`` otherwise."""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def extra_keys(obj: Mapping[str, object], handled: set[str]) -> list[str]:
    return [
        f"<{key}>{json.dumps(value) if isinstance(value, (dict, list)) else str(value)}</{key}>"
        for key, value in obj.items()
        if key not in handled
    ]


def tool_declaration(tool: Mapping[str, object]) -> str:
    """One tool in Nemotron's XML declaration format (the template's ``render_extra_keys`` included)."""
    lines = ["<function>", f"<name>{tool['name']}</name>"]
    description = str(tool.get("description", "")).strip()
    if description:
        lines.append(f"<description>{description}</description>")
    lines.append("<parameters>")
    params_obj = tool.get("parameters") or {}
    params = cast("Mapping[str, object]", params_obj) if isinstance(params_obj, Mapping) else None
    if params is not None and "properties" in params:
        properties = cast("Mapping[str, Mapping[str, object]]", params["properties"])
        for name, fields in properties.items():
            lines += ["<parameter>", f"<name>{name}</name>"]
            if "type" in fields:
                lines.append(f"<type>{fields['type']!s}</type>")
            if "description" in fields:
                lines.append(f"<description>{str(fields['description']).strip()}</description>")
            if "enum" in fields:
                lines.append(f"<enum>{json.dumps(fields['enum'])}</enum>")
            lines += extra_keys(fields, {"name", "type", "description", "enum"})
            lines.append("</parameter>")
    if params is not None:
        lines += extra_keys(params, {"type", "properties", "required"})
        if "required" in params:
            lines.append(f"<required>{json.dumps(params['required'])}</required>")
    lines.append("</parameters>")
    lines += extra_keys(tool, {"type", "name", "description", "parameters"})
    lines.append("</function>")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ parsing


def unparsed_entry(raw_text: str, error: str) -> dict[str, str]:
    return {"raw_text": raw_text, "error": error}


def parse_body(text: str, *, strip_one_newline: bool) -> Message:
    """The assistant message in a response's text (cut at ``<|im_end|>``).

    Think blocks become thinking (framing newlines and surrounding whitespace dropped, the
    separator after ``</think>`` removed from the text); ``<tool_call>`` blocks become tool calls
    (JSON or XML), or ``unparsed_tool_calls`` when they are neither or never closed.
    """
    if "<think>" not in text and "<tool_call>" not in text:
        return Message(role="assistant", content=text)
    parts: list[tuple[PartKind, str]] = []
    calls: list[ToolCall] = []
    unparsed: list[dict[str, str]] = []
    xml_candidates: list[str] = []
    pos = 0
    after_block = False

    def add_text(chunk: str) -> None:
        nonlocal after_block
        parts.append(("text", chunk.lstrip("\n") if after_block else chunk))
        after_block = False

    for match in THINK_OR_TOOL_RE.finditer(text):
        if match.start() > pos:
            add_text(text[pos : match.start()])
        thinking, call_text = match.group(1), match.group(2)
        if thinking is not None:
            if thinking:
                # A non-empty block frames its reasoning with newlines; an empty one is dropped whole.
                if reasoning := thinking.strip("\n"):
                    parts.append(("thinking", reasoning))
                after_block = True
        else:
            call = json_tool_call(call_text)
            if not isinstance(call, str):
                calls.append(call)
            else:
                xml_candidates.append(match.group(0))
                unparsed.append(unparsed_entry(match.group(0), "not a JSON tool call"))
        pos = match.end()
    if pos < len(text):
        add_text(text[pos:])
    if text.count("<tool_call>") > text.count("</tool_call>"):
        raw = text[text.rfind("<tool_call>") :][:DETAIL_MAX_CHARS]
        unparsed.append(
            unparsed_entry(raw, f"{UNTERMINATED}: '<tool_call>' opened without a matching '</tool_call>'")
        )

    # The first text after a thinking part loses the template's separator; thinking up to it is trimmed.
    seen_thinking = False
    for k, (kind, value) in enumerate(parts):
        if kind == "thinking":
            parts[k] = ("thinking", value.strip())
            seen_thinking = True
        elif seen_thinking:
            if strip_one_newline:
                value = value.removeprefix("\n")
            parts[k] = ("text", value.removeprefix("\n\n"))
            break

    kept: list[dict[str, str]] = []
    for entry in unparsed:
        raw = entry["raw_text"]
        if entry["error"].startswith(UNTERMINATED) or "<function=" not in raw:
            kept.append(entry)
            continue
        call = xml_function_call(raw)
        if isinstance(call, str):
            kept.append(unparsed_entry(raw, "malformed XML tool call"))
        else:
            calls.append(call)

    return assistant_message(
        "".join(v for kind, v in parts if kind == "text"),
        thinking="".join(v for kind, v in parts if kind == "thinking"),
        tool_calls=calls,
        unparsed=kept,
    )
