"""The DeepSeek renderers' response-parsing helpers: unparsed tool blocks, the parsed assistant
message, the reply cut at the end-of-sentence token (see :mod:`tempering.renderers.deepseek`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tempering.renderers._base import ParseTermination
from tempering.renderers._deepseek_turns import DETAIL_MAX_CHARS, THINK_BLOCK_RE, THINK_OPEN
from tempering.renderers._text import assistant_message
from tempering_protocols import Message, ToolCall


def unparsed_entry(raw_text: str, error: str) -> dict[str, str]:
    return {"raw_text": raw_text, "error": error}


def dangling_block(content: str, open_marker: str, close_marker: str) -> dict[str, str] | None:
    """A tool block opened more often than closed: the text from the last opening on."""
    opens = content.count(open_marker)
    if opens == 0 or opens <= content.count(close_marker):
        return None
    raw = content[content.rfind(open_marker) :][:DETAIL_MAX_CHARS]
    return unparsed_entry(
        raw, f"unterminated tool block: {open_marker!r} opened without a matching {close_marker!r}"
    )


def parsed_message(content: str, calls: Sequence[ToolCall], unparsed: Sequence[dict[str, str]]) -> Message:
    """The parsed assistant message: ``<think>…</think>`` blocks anywhere become the thinking (joined),
    the text around them the content; an unclosed ``<think>`` stays in the content."""
    thinking = ""
    if THINK_OPEN in content:
        text, pos = "", 0
        for match in THINK_BLOCK_RE.finditer(content):
            text += content[pos : match.start()]
            thinking += match.group(1)
            pos = match.end()
        content = text + content[pos:]
    return assistant_message(content, thinking=thinking, tool_calls=calls, unparsed=unparsed)


def tool_field(tool: Mapping[str, object], key: str) -> object:
    if key not in tool:
        raise ValueError(
            f"a tool spec needs {key!r} (name, description, parameters), got {dict(tool)!r:.120}"
        )
    return tool[key]


def parse_to_eos(
    tokens: list[int],
    eos: int,
    decode: Callable[[list[int]], str],
    read: Callable[[str], Message],
) -> tuple[Message, ParseTermination]:
    """The response's text before its end-of-sentence token, read by ``read`` (``STOP_SEQUENCE``).
    A response with no end-of-sentence token is truncated: its text comes back unparsed,
    ``MALFORMED``."""
    count = tokens.count(eos)
    if count > 1:
        raise ValueError(f"the response has {count} end-of-sentence tokens; a response ends at its first")
    if count == 0:
        return Message(role="assistant", content=decode(tokens)), ParseTermination.MALFORMED
    return read(decode(tokens[: tokens.index(eos)])), ParseTermination.STOP_SEQUENCE
