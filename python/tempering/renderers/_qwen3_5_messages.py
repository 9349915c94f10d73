"""What the Qwen3.5 / 3.8 renderers are built from: the format's constants, messages loaded into
:class:`Msg`, and response parsing (see :mod:`tempering.renderers.qwen3_5`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, TypeAlias, cast

import attrs

from tempering.renderers._messages import (
    DETAIL_MAX_CHARS,
    THINK_OR_TOOL_RE,
    UNTERMINATED,
    function_fields,
    json_tool_call,
    tool_call_arguments,
    xml_function_call,
)
from tempering_protocols import Message, ToolCall

PartKind: TypeAlias = Literal["text", "thinking"]
Part: TypeAlias = "tuple[PartKind, str]"

ROLES = ("system", "user", "assistant", "tool")
EMPTY_THINK = "<think>\n\n</think>\n\n"
OPEN_THINK = "<think>\n"

REASONING_EFFORTS: dict[str, str] = {
    "xhigh": (
        "Reasoning effort is set to xhigh. Please think carefully through the task, "
        "validate key assumptions, consider plausible alternatives, and prioritize "
        "correctness, consistency, and clarity in the final answer."
    ),
    "medium": "",
    "low": (
        "Reasoning effort is set to low. Keep your thinking brief and focused, moving "
        "directly to the conclusion without unnecessary elaboration."
    ),
}
"""The sentence Qwen3.8's template puts before the system prompt for each ``reasoning_effort``
(``medium`` adds none)."""

TOOLS_PREAMBLE = (
    "# Tools\n\nYou have access to the following functions:\n\n<tools>\n{tools}\n</tools>\n\n"
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> "
    "block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the "
    "function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n</IMPORTANT>"
)


# ------------------------------------------------------------------------------ message loading


@attrs.frozen
class CallFields:
    name: str
    arguments: dict[str, object]


@attrs.frozen
class Msg:
    """A message in one shape whatever format it came in.

    ``plain`` is true when the content was a string with no thinking field: the cookbook then
    looks for an inline ``<think>`` in it (Qwen3.5) where a parts list is asked for parts.
    ``calls`` is ``None`` when the message has no ``tool_calls`` key at all. ``index`` is where
    the message is in the caller's conversation (``None`` for a message the renderer added).
    """

    role: str
    parts: tuple[Part, ...]
    plain: bool
    calls: tuple[CallFields, ...] | None
    source: Message
    index: int | None


def message_parts(message: Mapping[str, object], where: str) -> tuple[tuple[Part, ...], bool]:
    content = message.get("content")
    thinking = message.get("thinking")
    if thinking is not None and not isinstance(thinking, str):
        raise TypeError(f"{where} has thinking of type {type(thinking).__name__}, not str")
    out: list[Part] = []
    if isinstance(content, str):
        if thinking:
            out.append(("thinking", thinking))
        out.append(("text", content))
        return tuple(out), not thinking
    if not isinstance(content, list):
        raise TypeError(f"{where} has content of type {type(content).__name__}, not str or a list of parts")
    for k, raw in enumerate(cast("list[object]", content)):
        if not isinstance(raw, Mapping):
            raise TypeError(f"{where}: content part {k} is a {type(raw).__name__}, not a dict")
        part = cast("Mapping[str, object]", raw)
        kind = part.get("type")
        if kind in ("image", "image_url", "audio"):
            raise ValueError(
                f"{where}: content part {k} is an {kind} part; the Qwen3.5 renderers here are text "
                "only (image chunks need the model's image processor)"
            )
        if kind not in ("text", "thinking"):
            raise ValueError(f"{where}: content part {k} has unknown type {kind!r}")
        value = part.get(str(kind))
        if not isinstance(value, str):
            raise TypeError(f"{where}: content part {k} ({kind}) has no str {kind!r} field")
        out.append((kind, value))
    if thinking:
        if any(kind == "thinking" for kind, _ in out):
            raise ValueError(f"{where} has both a thinking field and thinking parts; give one")
        out.insert(0, ("thinking", thinking))
    return tuple(out), False


def message_calls(message: Mapping[str, object], where: str) -> tuple[CallFields, ...] | None:
    """Tool calls in either format: ``{"name", "arguments"}`` or ``{"function": {...}}``."""
    if "tool_calls" not in message:
        return None
    raw = message.get("tool_calls")
    if not isinstance(raw, list):
        raise TypeError(f"{where} has tool_calls of type {type(raw).__name__}, not a list")
    out: list[CallFields] = []
    for k, item in enumerate(cast("list[object]", raw)):
        if not isinstance(item, Mapping):
            raise TypeError(f"{where}: tool call {k} is a {type(item).__name__}, not a mapping")
        call = cast("Mapping[str, object]", item)
        body = function_fields(call)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where}: tool call {k} has no str name: {dict(call)!r:.120}")
        out.append(CallFields(name, tool_call_arguments(body.get("arguments"), where, name)))
    return tuple(out)


def load_messages(messages: Sequence[Message]) -> list[Msg]:
    out: list[Msg] = []
    for i, message in enumerate(messages):
        m = cast("Mapping[str, object]", message)
        role = message["role"]
        where = f"message {i} ({role})"
        if role not in ROLES:
            raise ValueError(f"{where}: unknown role; the Qwen3.5 format has {', '.join(ROLES)}")
        parts, plain = message_parts(m, where)
        calls = message_calls(m, where)
        if calls and role != "assistant":
            raise ValueError(f"{where} has tool_calls; only assistants call tools")
        out.append(Msg(role, parts, plain, calls, message, i))
    return out


def trim_parts(parts: Sequence[Part]) -> tuple[Part, ...]:
    """The template's ``content|trim`` on the visible text, thinking parts left as they are.

    Leading whitespace goes from the first text parts (up to the first that keeps something),
    trailing whitespace from the last ones.
    """
    out = list(parts)
    visible = [i for i, (kind, _) in enumerate(out) if kind == "text"]
    for order, strip in ((visible, str.lstrip), (visible[::-1], str.rstrip)):
        for i in order:
            text = strip(out[i][1])
            out[i] = ("text", text)
            if text:
                break
    return tuple(out)


# ------------------------------------------------------------------------------ parsing helpers


def json_call_or_error(inner: str, raw: str) -> dict[str, str] | tuple[str, str]:
    """A Qwen3-style JSON tool call, or ``(raw_text, error)`` when the block is not one."""
    call = json_tool_call(inner)
    return (raw, call) if isinstance(call, str) else cast("dict[str, str]", call)


def xml_call_or_error(raw: str) -> dict[str, str] | tuple[str, str]:
    """A Qwen3.5 ``<function=…><parameter=…>`` tool call, or ``(raw_text, error)``."""
    call = xml_function_call(raw)
    return (raw, call) if isinstance(call, str) else cast("dict[str, str]", call)


def parse_body(text: str) -> Message:
    """Thinking, text and tool calls of a cleanly stopped response (its text before ``<|im_end|>``).

    Think blocks lose their framing newlines and surrounding whitespace, an empty one is dropped,
    and text right after a block loses its leading newlines. ``<tool_call>`` blocks are read as
    Qwen3 JSON first, then as Qwen3.5 XML; what neither reads, or a block left open, is reported
    in ``unparsed_tool_calls``.
    """
    message = Message(role="assistant", content=text)
    if "<think>" not in text and "<tool_call>" not in text:
        return message
    thinking: list[str] = []
    content: list[str] = []
    json_calls: list[dict[str, str]] = []
    failed: list[tuple[str, str]] = []
    pos = 0
    after_block = False
    for match in THINK_OR_TOOL_RE.finditer(text):
        before = text[pos : match.start()]
        if before:
            content.append(before.lstrip("\n") if after_block else before)
            after_block = False
        if match.group(1) is not None:
            reasoning = match.group(1).strip("\n").strip()
            if reasoning:
                thinking.append(reasoning)
            after_block = True
        else:
            result = json_call_or_error(match.group(2), match.group(0))
            if isinstance(result, dict):
                json_calls.append(result)
            else:
                failed.append(result)
        pos = match.end()
    rest = text[pos:]
    if rest:
        content.append(rest.lstrip("\n") if after_block else rest)
    if text.count("<tool_call>") > text.count("</tool_call>"):
        dangling = text[text.rfind("<tool_call>") :][:DETAIL_MAX_CHARS]
        failed.append((dangling, f"{UNTERMINATED}: '<tool_call>' opened without a matching '</tool_call>'"))
    xml_calls: list[dict[str, str]] = []
    unparsed: list[tuple[str, str]] = []
    for raw, error in failed:
        if error.startswith(UNTERMINATED) or "<function=" not in raw:
            unparsed.append((raw, error))
            continue
        result = xml_call_or_error(raw)
        if isinstance(result, dict):
            xml_calls.append(result)
        else:
            unparsed.append(result)
    message["content"] = "".join(content)
    if thinking:
        message["thinking"] = "".join(thinking)
    calls = [*json_calls, *xml_calls]
    if calls:
        message["tool_calls"] = [cast("ToolCall", c) for c in calls]
    if unparsed:
        extra = cast("dict[str, object]", message)
        extra["unparsed_tool_calls"] = [{"raw_text": r, "error": e} for r, e in unparsed]
    return message
