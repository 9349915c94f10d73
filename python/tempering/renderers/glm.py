"""GLM-5.3: ``[gMASK]<sop><|system|>Reasoning Effort: Max`` then role tokens, no end-of-message token.

A message is its role token and its text: ``<|system|>…``, ``<|user|>…``, ``<|assistant|><think>…
</think>answer``, ``<|observation|><tool_response>…</tool_response>``. Nothing closes a message: an
assistant turn ends when the model writes the next role token, ``<|user|>`` after an answer or
``<|observation|>`` after tool calls (``<|endoftext|>`` is accepted too). So that every assistant
message is trained to stop, the assistant message owns that token (it ends its completion and
the following message's header leaves it out); the token sequence is the same either way.

Tool calls are XML-like, one ``<tool_call>`` per call with string arguments written raw and other
values as JSON::

    <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>

Parsing reads each argument value back as JSON where it parses, as the raw string otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import ClassVar, cast

import attrs

from tempering.renderers._base import BaseRenderer, MessageParts, ParseTermination, Piece, Rendering
from tempering.renderers._base import message_weights as base_message_weights
from tempering.renderers._messages import (
    THINK_OR_TOOL_RE,
    ArgumentSyntax,
    function_fields,
    json_tool_call,
    tool_call_arguments,
)
from tempering_protocols import Message, StopCondition, Tokenizer, ToolCall, TrainOnWhat

__all__ = [
    "Glm53HighReasoningRenderer",
    "Glm53LowReasoningRenderer",
    "Glm53Renderer",
]

_ROLES = ("system", "user", "assistant", "tool")

_TOOLS_SYSTEM_PROMPT = (
    "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tool_lines}</tools>\n\n"
    "For each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{{function-name}}<arg_key>{{arg-key-1}}</arg_key><arg_value>{{arg-value-1}}</arg_value>"
    "<arg_key>{{arg-key-2}}</arg_key><arg_value>{{arg-value-2}}</arg_value>...</tool_call>"
)
"""The tool declaration the GLM-5.3 chat template writes (its own ``<|system|>`` message)."""

# A whole GLM tool call: the function name, then the argument pairs.
_GLM_CALL_RE = re.compile(
    r"^\s*<tool_call>\s*(?P<name>[\w\-\.]+)\s*(?P<body>.*?)\s*</tool_call>\s*$", re.DOTALL
)
_GLM_ARGUMENTS = ArgumentSyntax(
    re.compile(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>", re.DOTALL),
    strip_newlines=False,
    between="Unexpected content between tool call arguments",
    empty_key="Empty tool call argument key",
    trailing="Unexpected trailing content inside tool call",
)
"""The ``<arg_key>k</arg_key><arg_value>v</arg_value>`` arguments after a GLM call's name."""


# ----------------------------------------------------------------------------- input messages


@attrs.frozen
class _Call:
    """A tool call with its arguments decoded (key order kept, as the template iterates it)."""

    name: str
    arguments: dict[str, object]
    id: str | None


@attrs.frozen
class _Turn:
    """One input message, normalized from either message format."""

    index: int
    """Its position in the caller's list (for errors)."""
    role: str
    text: str
    """The visible text (text parts joined)."""
    reasoning: str | None = None
    """Thinking of an assistant message; ``None`` when it has none."""
    calls: tuple[_Call, ...] = ()
    tool_call_id: str | None = None


def _where(index: int, role: str) -> str:
    return f"message {index} ({role})"


def _parts(content: object, index: int, role: str) -> tuple[list[str], list[str]]:
    """The text and thinking strings of ``content`` (already checked by the base class)."""
    if isinstance(content, str):
        return [content], []
    if not isinstance(content, list):
        raise TypeError(f"{_where(index, role)} has content of type {type(content).__name__}")
    texts: list[str] = []
    thoughts: list[str] = []
    for part in cast("list[Mapping[str, str]]", content):
        if part["type"] == "thinking":
            thoughts.append(part["thinking"])
        else:
            texts.append(part["text"])
    return texts, thoughts


def _call(raw: object, where: str) -> _Call:
    """A tool call in tempering's ``{"name", "arguments", "id"?}`` or the cookbook's format."""
    if not isinstance(raw, Mapping):
        raise TypeError(f"{where}: a tool call is a {type(raw).__name__}, not a mapping")
    call = cast("Mapping[str, object]", raw)
    body = function_fields(call)
    name = body.get("name")
    if not isinstance(name, str):
        raise TypeError(f"{where}: a tool call needs a str name, got {dict(call)!r:.120}")
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise TypeError(f"{where}: tool call {name!r} has id {call_id!r}, not a str")
    return _Call(name, tool_call_arguments(body.get("arguments"), where, name), call_id)


def _turn(message: Message, index: int) -> _Turn:
    """Normalize one message; bad input raises naming the message."""
    msg = cast("Mapping[str, object]", message)
    role = message["role"]
    where = _where(index, role)
    if role not in _ROLES:
        raise ValueError(f"{where}: the GLM-5.3 format has no role {role!r} (it has {', '.join(_ROLES)})")
    texts, thoughts = _parts(msg.get("content"), index, role)
    thinking = msg.get("thinking")
    if thinking is not None:
        if not isinstance(thinking, str):
            raise TypeError(f"{where} has thinking of type {type(thinking).__name__}, not str")
        thoughts.insert(0, thinking)
    raw_calls = msg.get("tool_calls")
    if role != "assistant":
        if thoughts:
            raise ValueError(f"{where} has thinking; in the GLM-5.3 format only assistant messages think")
        if raw_calls:
            raise ValueError(f"{where} has tool_calls; only assistant messages call tools")
        call_id = msg.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise TypeError(f"{where} has tool_call_id {call_id!r}, not a str")
        return _Turn(index, role, "".join(texts), tool_call_id=call_id)
    if raw_calls is not None and not isinstance(raw_calls, list):
        raise TypeError(f"{where}: tool_calls is a {type(raw_calls).__name__}, not a list")
    calls = tuple(_call(c, where) for c in cast("list[object]", raw_calls or []))
    content = msg.get("content")
    reasoning: str | None = "".join(thoughts) if thoughts else None
    text = "".join(texts)
    if isinstance(content, str) and thinking is None and "</think>" in content:
        # Thinking written inline in a string, split as the chat template splits it.
        reasoning = content.split("</think>")[0].split("<think>")[-1]
        text = content.split("</think>")[-1]
    return _Turn(index, role, text, reasoning, calls)


def _tool_block_order(block: Sequence[_Turn], before: _Turn | None) -> list[_Turn]:
    """Tool results in the order of the calls they answer, when ids make that unambiguous.

    As the chat template does: every call of the preceding assistant message and every result in
    the block has a distinct, non-empty id, and every result answers one of the calls; otherwise
    the results stay in the order given.
    """
    if before is None or before.role != "assistant" or not before.calls:
        return list(block)
    call_ids = [c.id for c in before.calls]
    result_ids = [t.tool_call_id for t in block]
    for ids in (call_ids, result_ids):
        if not all(ids) or len(set(ids)) != len(ids):
            return list(block)
    if not set(result_ids) <= set(call_ids):
        return list(block)
    by_id = {t.tool_call_id: t for t in block}
    return [by_id[i] for i in call_ids if i in by_id]


def _in_call_order(turns: Sequence[_Turn]) -> list[_Turn]:
    """``turns`` with each run of tool results sorted by :func:`_tool_block_order`."""
    out: list[_Turn] = []
    i = 0
    while i < len(turns):
        if turns[i].role != "tool":
            out.append(turns[i])
            i += 1
            continue
        end = i
        while end < len(turns) and turns[end].role == "tool":
            end += 1
        out += _tool_block_order(turns[i:end], turns[i - 1] if i > 0 else None)
        i = end
    return out


def _format_value(value: object) -> str:
    """A tool-call argument value: a string raw, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _format_call(call: _Call) -> str:
    args = "".join(
        f"<arg_key>{key}</arg_key><arg_value>{_format_value(value)}</arg_value>"
        for key, value in call.arguments.items()
    )
    return f"<tool_call>{call.name}{args}</tool_call>"


# ----------------------------------------------------------------------------- parsing


def _parse_glm_call(raw: str) -> ToolCall | str:
    """A GLM ``<tool_call>name<arg_key>…`` block, or why it is not one.

    Values are read as JSON where they parse (``3`` is the number 3, so a string argument that
    looks like JSON comes back typed), else kept as the raw string.
    """
    match = _GLM_CALL_RE.match(raw)
    if match is None:
        return "Malformed GLM tool call"
    return _GLM_ARGUMENTS.tool_call(match.group("name"), match.group("body"))


def _parse_body(text: str) -> Message:
    """Think blocks and tool calls out of a response's text; the rest is the content.

    Calls whose body is JSON come first, then the GLM-format ones, each in order (as the
    reference orders them); a block that is neither goes to ``unparsed_tool_calls``.
    """
    message = Message(role="assistant", content=text)
    if "<think>" not in text and "<tool_call>" not in text:
        return message
    content: list[str] = []
    thinking: list[str] = []
    json_calls: list[ToolCall] = []
    glm_calls: list[ToolCall] = []
    unparsed: list[dict[str, str]] = []
    pos = 0
    for block in THINK_OR_TOOL_RE.finditer(text):
        content.append(text[pos : block.start()])
        pos = block.end()
        think, call_body = block.group(1), block.group(2)
        if think is not None:
            thinking.append(think)
            continue
        as_json = json_tool_call(cast("str", call_body))
        if not isinstance(as_json, str):
            json_calls.append(as_json)
            continue
        parsed = _parse_glm_call(block.group(0))
        if isinstance(parsed, str):
            unparsed.append({"raw_text": block.group(0), "error": parsed})
        else:
            glm_calls.append(parsed)
    content.append(text[pos:])
    message["content"] = "".join(content)
    if "".join(thinking):
        message["thinking"] = "".join(thinking)
    if json_calls or glm_calls:
        message["tool_calls"] = [*json_calls, *glm_calls]
    if unparsed:
        cast("dict[str, object]", message)["unparsed_tool_calls"] = unparsed
    return message


# ----------------------------------------------------------------------------- the renderer


class Glm53Renderer(BaseRenderer):
    """GLM-5.3 with maximum reasoning effort (the chat template's default); extends prefixes.

    Every prompt starts ``[gMASK]<sop><|system|>Reasoning Effort: Max``; every assistant
    message starts with a think block, kept in every turn (the template's ``clear_thinking``
    defaults to false), and its text is stripped of surrounding whitespace. The generation
    prompt ends ``<|assistant|><think>``: thinking cannot be turned off, and since sampling
    always starts from that ``<think>``, it is part of every assistant header (weight 0).

    An assistant message's completion ends with the role token the model writes to end its
    turn (``<|observation|>`` after tool calls, ``<|user|>`` otherwise), which the next
    message's header then leaves out; consecutive tool results share one ``<|observation|>``
    and are sorted into the order of the calls they answer when ids allow.

    Example::

        r = Glm53Renderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # [gMASK]<sop><|system|>Reasoning Effort: Max<|user|>2+2?<|assistant|><think>
        r.build_supervised_example(
            [{"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": "4", "thinking": "two and two"}])
        # …<|assistant|><think> | two and two</think>4<|user|>   (trained after the bar)
    """

    name = "glm5_3_max_reasoning"
    reasoning_effort: ClassVar[str] = "Max"
    """What the ``Reasoning Effort:`` system segment says."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self._gmask = self.special_token("[gMASK]")
        self._sop = self.special_token("<sop>")
        self._system = self.special_token("<|system|>")
        self._user = self.special_token("<|user|>")
        self._assistant = self.special_token("<|assistant|>")
        self._observation = self.special_token("<|observation|>")
        self._endoftext = self.special_token("<|endoftext|>")
        self._think_open = self.special_token("<think>")
        self._think_close = self.special_token("</think>")
        self._stops = (self._user, self._observation, self._endoftext)

    @property
    def extends_prefix(self) -> bool:
        return True

    def get_stop_sequences(self) -> StopCondition:
        return list(self._stops)

    # ------------------------------------------------------------------ rendering

    def _turns(self, messages: Sequence[Message]) -> list[_Turn]:
        """The messages normalized, with tool results in call order (as rendered)."""
        return _in_call_order([_turn(m, i) for i, m in enumerate(messages)])

    def _terminator(self, turn: _Turn, following: _Turn | None) -> int | None:
        """The role token that ends assistant ``turn``, if the model writes it.

        ``<|observation|>`` after tool calls, ``<|user|>`` otherwise; ``None`` when the next
        message does not start with that token (a system message, a tool result after a turn
        that called no tool): that token then stays in the next message's header.
        """
        expected = self._observation if turn.calls else self._user
        if following is None:
            return expected
        header = {"user": self._user, "tool": self._observation}.get(following.role)
        return expected if header == expected else None

    def _header(self, turns: Sequence[_Turn], k: int) -> tuple[Piece, ...]:
        turn = turns[k]
        prev = turns[k - 1] if k > 0 else None
        if turn.role == "system":
            return ((self._system,),)
        if turn.role == "assistant":
            return ((self._assistant,), (self._think_open,))
        supplied = prev is not None and prev.role == "assistant" and self._terminator(prev, turn) is not None
        if supplied or (turn.role == "tool" and prev is not None and prev.role == "tool"):
            return ()
        return ((self._user if turn.role == "user" else self._observation,),)

    def _completion(self, turns: Sequence[_Turn], k: int, *, generation: bool) -> tuple[Piece, ...]:
        turn = turns[k]
        if turn.role == "tool":
            return (f"<tool_response>{turn.text}</tool_response>",)
        if turn.role != "assistant":
            return (turn.text,)
        body = f"{turn.reasoning or ''}</think>{turn.text.strip()}{''.join(map(_format_call, turn.calls))}"
        last = k == len(turns) - 1
        end = self._terminator(turn, None if last else turns[k + 1])
        if end is None or (last and generation):
            return (body,)
        return (body, (end,))

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        turns = self._turns(messages)
        parts = tuple(
            MessageParts(self._header(turns, k), self._completion(turns, k, generation=generation))
            for k in range(len(turns))
        )
        prefix: tuple[Piece, ...] = (
            (self._gmask, self._sop, self._system),
            f"Reasoning Effort: {self.reasoning_effort}",
        )
        gen: tuple[Piece, ...] = ((self._assistant, self._think_open),) if generation else ()
        return Rendering(prefix=prefix, messages=parts, generation_header=gen)

    def message_weights(self, messages: Sequence[Message], train_on_what: TrainOnWhat) -> list[float]:
        """Weights of the messages in rendered order (tool results sorted into call order)."""
        ordered = [messages[t.index] for t in self._turns(messages)]
        return base_message_weights(ordered, train_on_what, turn_start=self.turn_start_index(ordered[:-1]))

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[Mapping[str, object]], system_prompt: str = ""
    ) -> list[Message]:
        """A ``<|system|>`` tool declaration (one JSON object per line), then ``system_prompt``.

        As in the chat template, a tool with a truthy ``defer_loading`` is left out and the
        ``strict`` / ``defer_loading`` keys are not written.

        Example::

            r.create_conversation_prefix_with_tools([weather_tool], "Be brief.")
            # [{"role": "system", "content": "\\n# Tools\\n…"}, {"role": "system", "content": "Be brief."}]
        """
        messages: list[Message] = []
        if tools:
            lines = "".join(
                json.dumps(
                    {k: v for k, v in tool.items() if k not in ("strict", "defer_loading")},
                    ensure_ascii=False,
                )
                + "\n"
                for tool in tools
                if not tool.get("defer_loading")
            )
            messages.append(Message(role="system", content=_TOOLS_SYSTEM_PROMPT.format(tool_lines=lines)))
        if system_prompt:
            messages.append(Message(role="system", content=system_prompt))
        return messages

    # ------------------------------------------------------------------ parsing

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """Cut at the stop token; split off think blocks and tool calls.

        The generation prompt's ``<think>`` is put back in front when the response closes a
        think block. With no stop token the response is truncated: its text is returned as
        is, ``MALFORMED``. ``<|endoftext|>`` ends it as ``EOS``; more than one stop token
        is a ``ValueError`` (sampling was not stopped by the format's stop tokens).

        Example::

            r.parse(tokenizer.encode("two and two</think>4<|user|>"))
            # ({"role": "assistant", "content": "4", "thinking": "two and two"}, STOP_SEQUENCE)
        """
        ids = list(tokens)
        if ids and ids[0] != self._think_open and self._think_close in ids:
            ids.insert(0, self._think_open)
        stops = [i for i, t in enumerate(ids) if t in self._stops]
        if not stops:
            return Message(role="assistant", content=self.decode(ids)), ParseTermination.MALFORMED
        if len(stops) > 1:
            raise ValueError(
                f"the response has {len(stops)} stop tokens ({', '.join(map(str, stops))}), "
                "not one: sample with this renderer's stop sequences"
            )
        end = stops[0]
        termination = ParseTermination.EOS if ids[end] == self._endoftext else ParseTermination.STOP_SEQUENCE
        return _parse_body(self.decode(ids[:end])), termination


class Glm53HighReasoningRenderer(Glm53Renderer):
    """GLM-5.3 with high reasoning effort (``reasoning_effort="high"`` in the chat template).

    Example::

        r = Glm53HighReasoningRenderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # [gMASK]<sop><|system|>Reasoning Effort: High<|user|>2+2?<|assistant|><think>
    """

    name = "glm5_3_high_reasoning"
    reasoning_effort = "High"


class Glm53LowReasoningRenderer(Glm53Renderer):
    """GLM-5.3 with low reasoning effort: the closest it has to not thinking (it always opens a think block).

    Example::

        r = Glm53LowReasoningRenderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # [gMASK]<sop><|system|>Reasoning Effort: Low<|user|>2+2?<|assistant|><think>
    """

    name = "glm5_3_low_reasoning"
    reasoning_effort = "Low"


RENDERERS = {
    "glm5_3_max_reasoning": Glm53Renderer,
    "glm5_3_low_reasoning": Glm53LowReasoningRenderer,
    "glm5_3_high_reasoning": Glm53HighReasoningRenderer,
}
"""This module's registry names (see :data:`tempering.renderers.RENDERERS`)."""
