"""Message-level helpers shared by the formats: tool-call shapes, JSON tool calls, block regexes."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import cast

import attrs

from tempering_protocols import ToolCall

__all__ = [
    "DETAIL_MAX_CHARS",
    "FUNCTION_RE",
    "PARAMETER_RE",
    "THINK_OR_TOOL_RE",
    "UNTERMINATED",
    "XML_PARAMETERS",
    "ArgumentSyntax",
    "function_fields",
    "json_tool_call",
    "read_tool_call",
    "tool_call_arguments",
    "tool_call_fields",
    "xml_function_call",
]

UNTERMINATED = "unterminated tool block"
"""Prefix of the error for a ``<tool_call>`` opened and never closed."""
DETAIL_MAX_CHARS = 16384
"""The most raw text an unparsed tool call keeps."""

THINK_OR_TOOL_RE = re.compile(r"<think>(.*?)</think>|<tool_call>(.*?)</tool_call>", re.DOTALL)
"""A ``<think>`` block (group 1) or a ``<tool_call>`` block (group 2)."""
FUNCTION_RE = re.compile(
    r"^\s*<tool_call>\s*<function=(?P<name>[^>\n]+)>\s*(?P<body>.*?)\s*</function>\s*</tool_call>\s*$",
    re.DOTALL,
)
"""A whole ``<tool_call><function=name>…</function></tool_call>`` block (Qwen3.5 / Nemotron)."""
PARAMETER_RE = re.compile(r"<parameter=(?P<key>[^>\n]+)>\s*(?P<value>.*?)\s*</parameter>", re.DOTALL)
"""One ``<parameter=name>value</parameter>`` inside a function block."""


def json_tool_call(body: str) -> ToolCall | str:
    """A ``{"name", "arguments": {...}, "id"?}`` JSON tool call, or why the text is not one.

    The arguments are re-serialized with ``json.dumps`` (ASCII-escaped), as the cookbook does.
    """
    try:
        value: object = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return f"Invalid JSON: {exc}"
    if not isinstance(value, dict):
        return "Tool call is not a JSON object"
    obj = cast("dict[str, object]", value)
    name, arguments, call_id = obj.get("name"), obj.get("arguments"), obj.get("id")
    if not isinstance(name, str):
        return "Missing or invalid 'name' field"
    if not isinstance(arguments, dict):
        return "Missing or invalid 'arguments' field"
    call = ToolCall(name=name, arguments=json.dumps(arguments))
    if isinstance(call_id, str):
        call["id"] = call_id
    return call


def function_fields(call: Mapping[str, object]) -> Mapping[str, object]:
    """The fields of a tool call: its ``"function"`` mapping (the cookbook's nesting) or itself."""
    function = call.get("function")
    return cast("Mapping[str, object]", function) if isinstance(function, Mapping) else call


def tool_call_fields(raw: object, where: str) -> tuple[str, str]:
    """``(name, arguments)`` of a tool call in tempering's ``{"name", "arguments"}`` or the
    cookbook's ``{"function": {...}}`` form; ``where`` names the message in errors."""
    if not isinstance(raw, Mapping):
        raise TypeError(f"{where}: a tool call is a {type(raw).__name__}, not a mapping")
    call = cast("Mapping[str, object]", raw)
    body = function_fields(call)
    name, arguments = body.get("name"), body.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise TypeError(
            f"{where}: a tool call needs a str name and str (JSON) arguments, got {dict(call)!r:.120}"
        )
    return name, arguments


def read_tool_call(raw: object, where: str) -> ToolCall:
    """A tool call in either form (:func:`tool_call_fields`), keeping its ``id`` when it has one."""
    name, arguments = tool_call_fields(raw, where)
    out = ToolCall(name=name, arguments=arguments)
    call_id = cast("Mapping[str, object]", raw).get("id")
    if call_id is not None:
        if not isinstance(call_id, str):
            raise TypeError(f"{where}: a tool call id is a str, got {call_id!r}")
        out["id"] = call_id
    return out


def tool_call_arguments(text: object, where: str, name: str) -> dict[str, object]:
    """A call's JSON arguments as a mapping (``{}`` for empty text); ``where`` names the message."""
    if not isinstance(text, str):
        raise TypeError(f"{where}: tool call {name!r} has arguments of type {type(text).__name__}, not str")
    if not text:
        return {}
    try:
        value: object = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: tool call {name!r} has arguments that are not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: tool call {name!r} has arguments {text!r:.80}, not a JSON object")
    return cast("dict[str, object]", value)


@attrs.frozen
class ArgumentSyntax:
    """How a format writes a tool call's arguments: a run of ``pattern`` matches (groups ``key``
    and ``value``) with only white space between them, and the errors that say why a body is not
    one (``between``, ``empty_key``, ``trailing``).

    A value is read as JSON when it parses (``12`` is a number) and kept as text otherwise;
    ``strip_newlines`` strips newlines around it first. Keys are stripped of white space.

    Example::

        XML_PARAMETERS.arguments("<parameter=n>\\n12\\n</parameter>")  # {"n": 12}
    """

    pattern: re.Pattern[str]
    strip_newlines: bool
    between: str
    empty_key: str
    trailing: str

    def arguments(self, body: str) -> dict[str, object] | str:
        """The arguments written in ``body``, or the error saying why it is not a run of pairs."""
        arguments: dict[str, object] = {}
        pos = 0
        for pair in self.pattern.finditer(body):
            if body[pos : pair.start()].strip():
                return self.between
            key = pair.group("key").strip()
            if not key:
                return self.empty_key
            text = pair.group("value")
            if self.strip_newlines:
                text = text.strip("\n")
            try:
                arguments[key] = cast("object", json.loads(text))
            except json.JSONDecodeError:
                arguments[key] = text
            pos = pair.end()
        if body[pos:].strip():
            return self.trailing
        return arguments

    def tool_call(self, name: str, body: str) -> ToolCall | str:
        """A call of ``name`` with the arguments in ``body`` (JSON-encoded), or why it is not one."""
        arguments = self.arguments(body)
        if isinstance(arguments, str):
            return arguments
        return ToolCall(name=name, arguments=json.dumps(arguments))


XML_PARAMETERS = ArgumentSyntax(
    PARAMETER_RE,
    strip_newlines=True,
    between="Unexpected non-parameter content inside <function> block",
    empty_key="Empty parameter name",
    trailing="Unexpected trailing content inside <function> block",
)
"""The ``<parameter=name>value</parameter>`` arguments of a Qwen3.5 / Nemotron function block."""


def xml_function_call(raw: str) -> ToolCall | str:
    """A ``<tool_call><function=name><parameter=k>v</parameter>…`` block as a tool call, or why
    it is not one (Qwen3.5 / Nemotron).

    A parameter value is read as JSON when it parses (``12`` is a number) and as text otherwise.
    """
    match = FUNCTION_RE.match(raw)
    if match is None:
        return "Malformed Qwen3.5 tool call XML"
    name = match.group("name").strip()
    if not name:
        return "Missing function name"
    return XML_PARAMETERS.tool_call(name, match.group("body"))
