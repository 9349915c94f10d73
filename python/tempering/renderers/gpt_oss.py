"""gpt-oss: OpenAI's Harmony format, ``<|start|>role<|channel|>channel<|message|>…<|end|>``.

Messages follow each other with no separator. An assistant turn is one or more Harmony messages
on *channels*: ``analysis`` (the reasoning), ``commentary`` (tool calls, addressed with
``to=functions.<name>`` and ended by ``<|call|>``, and any text said before them) and ``final``
(the answer). The answer of the last message ends with ``<|return|>``; in history it ends with
``<|end|>``, so a rendering is not a prefix of the next turn's prompt (``extends_prefix`` is
False, as in the Tinker Cookbook).

Tempering writes the format itself rather than through the ``openai-harmony`` package: that
package renders with its own o200k tokenizer, whose vocabulary it downloads at run time, so it
can neither run offline nor tokenize with the tokenizer a renderer is given.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import cast

import attrs

from tempering.renderers._base import BaseRenderer, MessageParts, ParseTermination, Rendering
from tempering.renderers._messages import read_tool_call
from tempering.renderers._pieces import PieceRun
from tempering.renderers._text import assistant_message
from tempering.renderers.gpt_oss_tools import (
    harmony_tool_declarations,
)
from tempering_protocols import Message, StopCondition, Tokenizer, ToolCall, TrainOnWhat

__all__ = ["SYSTEM_ROLE", "GptOssRenderer", "harmony_tool_declarations"]

SYSTEM_ROLE = "_gptoss_internal_system"
"""The role of a message rendered as Harmony's own ``system`` message (a user's ``system``
message is rendered as ``developer``, as the Hugging Face template does). The Tinker Cookbook's
name, so its tool-declaration prefixes load unchanged."""

_SYSTEM_PROMPT = (
    "You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n"
    "Current date: {date}\n\n"
    "Reasoning: {effort}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
)
_TOOL_ROUTING = "Calls to these tools must go to the commentary channel: 'functions'."
_PLAIN_ROLES = ("user", "developer", "system", SYSTEM_ROLE)
_CONTROL_TOKENS = (
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
)
"""Harmony's control tokens, each one token of the tokenizer (in the order the renderer unpacks them)."""

_CHANNEL_RE = re.compile(r"[^<\s]+")
_RECIPIENT_RE = re.compile(r"to=([^\s<]+)")


# ------------------------------------------------------------------------------- input messages


def _content_parts(message: Mapping[str, object]) -> list[tuple[str, str]]:
    """``(kind, text)`` for each content part (a str content is one text part)."""
    content = message.get("content")
    if isinstance(content, str):
        return [("text", content)]
    out: list[tuple[str, str]] = []
    for part in cast("list[Mapping[str, object]]", content):
        kind = str(part.get("type"))
        out.append((kind, str(part.get(kind, ""))))
    return out


def _plain_text(message: Mapping[str, object], index: int, role: str) -> str:
    """The content of a message that is not an assistant's: text only, one part at most."""
    parts = _content_parts(message)
    if message.get("thinking") or len(parts) != 1 or parts[0][0] != "text":
        raise ValueError(
            f"message {index} ({role}) must be plain text (a str, or a single text part) in the "
            f"gpt-oss format: only assistant messages carry thinking or several parts"
        )
    return parts[0][1]


def _thinking_and_text(message: Mapping[str, object], index: int) -> tuple[str, str]:
    """An assistant message's thinking (the ``thinking`` field, then thinking parts) and text."""
    parts = _content_parts(message)
    field = message.get("thinking") or ""
    if not isinstance(field, str):
        raise TypeError(f"message {index} (assistant): thinking is a {type(field).__name__}, not a str")
    thinking = field + "".join(t for kind, t in parts if kind == "thinking")
    return thinking, "".join(t for kind, t in parts if kind == "text")


def _tool_calls(message: Mapping[str, object], index: int) -> list[ToolCall]:
    """Tool calls in either format: ``{"name", "arguments", "id"?}`` or the cookbook's
    ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
    calls = message.get("tool_calls")
    if not calls:
        return []
    if not isinstance(calls, list):
        raise TypeError(f"message {index}: tool_calls is a {type(calls).__name__}, not a list")
    out: list[ToolCall] = []
    for k, call in enumerate(cast("list[object]", calls)):
        read = read_tool_call(call, f"message {index}: tool call {k}")
        out.append(ToolCall(name=read["name"], arguments=read["arguments"]))
    return out


def _tool_name(messages: Sequence[Message], index: int) -> str:
    """The function a tool result answers: its ``name``, else the call its ``tool_call_id`` names."""
    message = messages[index]
    name = cast("object", message.get("name"))
    if name and not isinstance(name, str):
        raise TypeError(f"message {index} (tool): name is a {type(name).__name__}, not a str")
    if isinstance(name, str) and name:
        return name
    call_id = message.get("tool_call_id")
    if call_id:
        for earlier in reversed(messages[:index]):
            for call in cast("list[Mapping[str, object]]", earlier.get("tool_calls") or []):
                body = call.get("function", call)
                fields = cast("Mapping[str, object]", body) if isinstance(body, Mapping) else {}
                if call.get("id") == call_id and isinstance(fields.get("name"), str):
                    return cast("str", fields["name"])
    raise ValueError(
        f"message {index} (tool) has no 'name' and no 'tool_call_id' of an earlier tool call: the "
        "gpt-oss format addresses a tool result from the function (functions.<name>)"
    )


# ------------------------------------------------------------------------------- parsing


@attrs.frozen
class _HarmonyMessage:
    """One Harmony message of a sampled response, as the Tinker Cookbook's parser reads it."""

    channel: str | None
    recipient: str | None
    body: str
    raw_text: str


def _first_channel(header: Sequence[int | str], channel_id: int) -> str | None:
    """The channel name: the text right after the first ``<|channel|>`` that starts with one."""
    for k, seg in enumerate(header):
        if seg == channel_id and k + 1 < len(header):
            nxt = header[k + 1]
            match = _CHANNEL_RE.match(nxt) if isinstance(nxt, str) else None
            if match:
                return match.group(0)
    return None


def _first_recipient(header: Sequence[int | str]) -> str | None:
    for seg in header:
        match = _RECIPIENT_RE.search(seg) if isinstance(seg, str) else None
        if match:
            return match.group(1)
    return None


# ------------------------------------------------------------------------------- the renderer


class GptOssRenderer(BaseRenderer):
    """gpt-oss in the Harmony format; does not extend prefixes.

    With ``reasoning_effort`` (``"low"``, ``"medium"``, ``"high"``) every conversation starts
    with OpenAI's system message (knowledge cutoff, ``Current date: <today>``, ``Reasoning:
    <effort>``); without it, with none. The date is ``current_date`` if given, else today's
    local date at each render, as the Tinker Cookbook does. A user's ``system`` message is
    rendered as a ``developer`` message under ``# Instructions``.

    Thinking becomes an ``analysis`` message and is kept in every turn; text said alongside tool
    calls a ``commentary`` message; each tool call a ``commentary`` message ``to=functions.<name>``
    with ``<|constrain|>json``, ended by ``<|call|>``; otherwise the text is the ``final`` message,
    ended by ``<|return|>`` if it is the last message and ``<|end|>`` in history. A tool result
    is addressed from ``functions.<name>`` (its ``name``, or the call its ``tool_call_id`` names).

    With a system prompt, ``train_on_what=all_messages`` / ``all_tokens`` train the built-in
    system message too, and ``customized`` is refused (it has no ``trainable`` flag), as in the
    Tinker Cookbook.

    Example::

        r = GptOssRenderer(tokenizer, reasoning_effort="medium")
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # <|start|>system<|message|>You are ChatGPT, …Reasoning: medium…<|end|>
        # <|start|>user<|message|>2+2?<|end|><|start|>assistant
        r.get_stop_sequences()  # [<|return|>, <|call|>]
    """

    name = "gpt_oss_no_sysprompt"

    def __init__(
        self, tokenizer: Tokenizer, *, reasoning_effort: str | None = None, current_date: str | None = None
    ) -> None:
        if reasoning_effort is not None:
            if not reasoning_effort:
                raise ValueError(
                    "reasoning_effort is 'low', 'medium' or 'high' (or None for no system prompt)"
                )
            self.name = f"gpt_oss_{reasoning_effort}_reasoning"
        super().__init__(tokenizer)
        self.reasoning_effort = reasoning_effort
        self.current_date = current_date
        self._names = {self.special_token(token): token for token in _CONTROL_TOKENS}
        """Each control token's text by id (what parsing splits at and error messages show)."""
        self._start, self._end, self._message, self._channel, self._constrain, self._return, self._call = (
            self._names
        )

    @property
    def extends_prefix(self) -> bool:
        return False

    def get_stop_sequences(self) -> StopCondition:
        return [self._return, self._call]

    def system_prompt(self) -> str | None:
        """The built-in system message's text (today's date unless ``current_date``), if any."""
        if self.reasoning_effort is None:
            return None
        date = self.current_date if self.current_date is not None else datetime.now().strftime("%Y-%m-%d")
        return _SYSTEM_PROMPT.format(date=date, effort=self.reasoning_effort)

    # ------------------------------------------------------------------- rendering

    def _plain(self, header_role: str, text: str) -> MessageParts:
        header = PieceRun().token(self._start).text(header_role).pieces()
        return MessageParts(header, PieceRun().token(self._message).text(text).token(self._end).pieces())

    def _assistant(self, message: Message, index: int, is_last: bool) -> MessageParts:
        thinking, text = _thinking_and_text(message, index)
        calls = _tool_calls(message, index)
        out = PieceRun()
        if thinking:
            out.token(self._channel).text("analysis").token(self._message).text(thinking)
            out.token(self._end).token(self._start).text("assistant")
        if calls:
            if text:
                out.token(self._channel).text("commentary").token(self._message).text(text)
                out.token(self._end).token(self._start).text("assistant")
            for k, call in enumerate(calls):
                if k > 0:
                    out.token(self._start).text("assistant")
                out.text(f" to=functions.{call['name']}").token(self._channel).text("commentary ")
                out.token(self._constrain).text("json").token(self._message).text(call["arguments"])
                out.token(self._call)
        else:
            out.token(self._channel).text("final").token(self._message).text(text)
            out.token(self._return if is_last else self._end)
        return MessageParts(PieceRun().token(self._start).text("assistant").pieces(), out.pieces())

    def _tool_result(self, messages: Sequence[Message], index: int) -> MessageParts:
        name = _tool_name(messages, index)
        if not name.startswith("functions."):
            name = f"functions.{name}"
        text = _plain_text(messages[index], index, "tool")
        header = PieceRun().token(self._start).text(f"{name} to=assistant").pieces()
        body = PieceRun().token(self._channel).text("commentary").token(self._message).text(text)
        return MessageParts(header, body.token(self._end).pieces())

    def _render_message(self, messages: Sequence[Message], index: int) -> MessageParts:
        message = messages[index]
        role = message["role"]
        if role == "assistant":
            return self._assistant(message, index, is_last=index == len(messages) - 1)
        if message.get("tool_calls"):
            raise ValueError(f"message {index} ({role}) has tool_calls; only assistants call tools")
        if role == "tool":
            return self._tool_result(messages, index)
        if role not in _PLAIN_ROLES:
            raise ValueError(
                f"message {index} has role {role!r}; the gpt-oss format knows system, developer, "
                "user, assistant and tool"
            )
        text = _plain_text(message, index, role)
        if role == "system":
            return self._plain("developer", f"# Instructions\n\n{text}\n\n")
        return self._plain("system" if role == SYSTEM_ROLE else role, text)

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        parts = [self._render_message(messages, i) for i in range(len(messages))]
        system = self.system_prompt()
        if system is not None:
            parts.insert(0, self._plain("system", system))
        gen = PieceRun().token(self._start).text("assistant").pieces() if generation else ()
        return Rendering(prefix=(), messages=tuple(parts), generation_header=gen)

    def message_weights(self, messages: Sequence[Message], train_on_what: TrainOnWhat) -> list[float]:
        """The user's messages' weights, after the built-in system message's (if there is one)."""
        weights = super().message_weights(messages, train_on_what)
        if self.reasoning_effort is None:
            return weights
        if train_on_what == TrainOnWhat.CUSTOMIZED:
            raise ValueError(
                f"the {self.name} renderer starts every conversation with its own system message, "
                "which has no 'trainable' flag, so train_on_what=customized cannot weight it (the "
                "Tinker Cookbook refuses this too); use gpt_oss_no_sysprompt with your own system "
                "message, or another train_on_what"
            )
        trained = train_on_what in (TrainOnWhat.ALL_MESSAGES, TrainOnWhat.ALL_TOKENS)
        return [float(trained), *weights]

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[Mapping[str, object]], system_prompt: str = ""
    ) -> list[Message]:
        """A Harmony ``system`` message routing tool calls to the commentary channel (if there are
        tools) and a ``developer`` message with ``# Instructions`` and the ``# Tools`` namespace.

        Example::

            prefix = r.create_conversation_prefix_with_tools(tools, "You are terse.")
            [m["role"] for m in prefix]  # ["_gptoss_internal_system", "developer"]
        """
        out: list[Message] = []
        if tools:
            out.append(Message(role=SYSTEM_ROLE, content=_TOOL_ROUTING))
        sections = [f"# Instructions\n\n{system_prompt}"] if system_prompt else []
        if tools:
            sections.append(harmony_tool_declarations(tools))
        if sections:
            out.append(Message(role="developer", content="\n\n".join(sections)))
        return out

    # ------------------------------------------------------------------- parsing

    def _segments(self, tokens: Sequence[int]) -> list[int | str]:
        """The tokens as Harmony's special tokens (ids) and the decoded text between them."""
        out: list[int | str] = []
        run: list[int] = []
        for t in tokens:
            if t in self._names:
                if run:
                    out.append(self.decode(run))
                    run = []
                out.append(t)
            else:
                run.append(t)
        if run:
            out.append(self.decode(run))
        return out

    def _show(self, segments: Sequence[int | str]) -> str:
        return "".join(s if isinstance(s, str) else self._names[s] for s in segments)

    def _harmony_messages(self, segments: Sequence[int | str]) -> list[_HarmonyMessage]:
        """Split at ``<|message|>``: the header runs from the last ``<|start|>`` before it, the
        body to the next ``<|end|>`` / ``<|call|>`` / ``<|return|>`` (or the end)."""
        ends = (self._end, self._call, self._return)
        out: list[_HarmonyMessage] = []
        i, n = 0, len(segments)
        while True:
            m = next((k for k in range(i, n) if segments[k] == self._message), None)
            if m is None:
                return out
            h = next((k for k in range(m - 1, i - 1, -1) if segments[k] == self._start), i)
            e = next((k for k in range(m + 1, n) if segments[k] in ends), None)
            stop = n if e is None else e
            header = segments[h:m]
            out.append(
                _HarmonyMessage(
                    channel=_first_channel(header, self._channel),
                    recipient=_first_recipient(header),
                    body=self._show(segments[m + 1 : stop]),
                    raw_text=self._show(segments[h : n if e is None else e + 1]),
                )
            )
            i = n if e is None else e + 1

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """Cut at ``<|return|>`` or ``<|call|>``; ``analysis`` becomes thinking, ``final`` and
        ``commentary`` text, a message ``to=functions.<name>`` a tool call (its body is JSON).

        No stop token is a truncated (MALFORMED) response; two of the same raise ``ValueError``
        (sampling was not stopped at them). A response with no non-empty message keeps its
        whole text, markup included, as content (as the Tinker Cookbook does).

        Example::

            r.parse(tokens_of("<|channel|>final<|message|>4<|return|>"))
            # ({"role": "assistant", "content": "4"}, ParseTermination.STOP_SEQUENCE)
        """
        tokens = list(tokens)
        found = [tokens.index(t) for t in (self._return, self._call) if t in tokens]
        if not found:
            return assistant_message(self.decode(tokens)), ParseTermination.MALFORMED
        for t in (self._return, self._call):
            if tokens.count(t) > 1:
                raise ValueError(
                    f"the response has {tokens.count(t)} {self._names[t]} tokens; sampling should stop "
                    f"at the first (use get_stop_sequences())"
                )
        body = tokens[: min(found)]
        segments = self._segments(body)
        texts: list[str] = []
        thinking: list[str] = []
        calls: list[ToolCall] = []
        unparsed: list[dict[str, str]] = []
        for msg in self._harmony_messages(segments):
            if not msg.body.strip():
                continue
            if msg.recipient is not None and msg.recipient.startswith("functions."):
                try:
                    json.loads(msg.body)
                except json.JSONDecodeError as exc:
                    unparsed.append({"raw_text": msg.raw_text, "error": f"Invalid JSON: {exc}"})
                else:
                    calls.append(
                        ToolCall(name=msg.recipient.split("functions.", 1)[1], arguments=msg.body.strip())
                    )
            elif msg.channel == "analysis":
                thinking.append(msg.body)
            elif msg.channel in ("final", "commentary"):
                texts.append(msg.body)
        intents = sum(s.count("to=functions.") for s in segments if isinstance(s, str))
        if intents > len(calls) + len(unparsed):
            start = next((k for k in range(len(segments) - 1, -1, -1) if segments[k] == self._start), 0)
            unparsed.append(
                {
                    "raw_text": self._show(segments[start:]),
                    "error": "unterminated tool block: 'to=functions.' tool-call header without a "
                    "parsable arguments payload",
                }
            )
        content = "".join(texts) if texts or thinking else self.decode(body)
        message = assistant_message(content, thinking="".join(thinking), tool_calls=calls, unparsed=unparsed)
        return message, ParseTermination.STOP_SEQUENCE


RENDERERS: dict[str, Callable[[Tokenizer], BaseRenderer]] = {
    "gpt_oss_no_sysprompt": GptOssRenderer,
    "gpt_oss_low_reasoning": functools.partial(GptOssRenderer, reasoning_effort="low"),
    "gpt_oss_medium_reasoning": functools.partial(GptOssRenderer, reasoning_effort="medium"),
    "gpt_oss_high_reasoning": functools.partial(GptOssRenderer, reasoning_effort="high"),
}
"""This module's registry names (see :data:`tempering.renderers.RENDERERS`)."""
