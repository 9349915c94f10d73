"""DeepSeek V4.1 (``deepseekv4_1*``): the renderers, DSML tool calls and the template's turns.

The format is described in :mod:`tempering.renderers.deepseek`, which registers these renderers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import ClassVar, cast

import attrs

from tempering.renderers._base import BaseRenderer, MessageParts, ParseTermination, Piece, Rendering
from tempering.renderers._base import message_weights as base_message_weights
from tempering.renderers._deepseek_parse import (
    dangling_block,
    parse_to_eos,
    parsed_message,
    unparsed_entry,
)
from tempering.renderers._deepseek_turns import (
    ASSISTANT,
    BOS,
    DSML,
    EOS,
    SYSTEM,
    THINK_CLOSE,
    THINK_OPEN,
    USER,
    Turn,
    read_turns,
)
from tempering.renderers._pieces import PieceRun
from tempering_protocols import Message, StopCondition, Tokenizer, ToolCall, TrainOnWhat

__all__ = [
    "DeepSeekV41DisableThinkingRenderer",
    "DeepSeekV41LowReasoningRenderer",
    "DeepSeekV41MaxReasoningRenderer",
    "DeepSeekV41Renderer",
    "v41_preserve_thinking",
]


# ----------------------------------------------------------------------------- DeepSeek V4.1

_EFFORT_LINE = (
    "Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
)

_V41_TOOLS_TEXT = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    'writing a "<｜DSML｜ calls>" block like the following:\n\n'
    "<｜DSML｜ calls>\n"
    '<｜DSML｜ invoke name="$TOOL_NAME">\n'
    '<｜DSML｜ parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜ parameter>\n'
    "...\n"
    "</｜DSML｜ invoke>\n"
    '<｜DSML｜ invoke name="$TOOL_NAME2">\n'
    "...\n"
    "</｜DSML｜ invoke>\n"
    "</｜DSML｜ calls>\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types (numbers, '
    'booleans, arrays, objects), pass the value in JSON format and set `string="false"`.\n\n'
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{schemas}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
)
"""DeepSeek V4.1's tool declaration, written into the ``<｜System｜>`` turn after the system text."""

_DSML_CALLS_OPEN, _DSML_CALLS_CLOSE = f"<{DSML} calls>", f"</{DSML} calls>"
_DSML_BLOCK_RE = re.compile(r"(?:\n\n)?<｜DSML｜ calls>.*?</｜DSML｜ calls>", re.DOTALL)
_DSML_INVOKE_RE = re.compile(r'<｜DSML｜ invoke name="(.*?)">\n(.*?)</｜DSML｜ invoke>', re.DOTALL)
_DSML_PARAM_RE = re.compile(
    r'<｜DSML｜ parameter name="(.*?)" string="(true|false)">(.*?)</｜DSML｜ parameter>', re.DOTALL
)

_USER_TURN_ROLES = ("user", "tool")


def _argument_dict(arguments: str) -> dict[str, object]:
    """The arguments as a JSON object (double-encoded JSON is read through, as ``encoding.py`` does);
    anything else becomes a single ``arguments`` parameter."""
    value: object = arguments
    for _ in range(2):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                break
    return cast("dict[str, object]", value) if isinstance(value, dict) else {"arguments": arguments}


def _dsml_run(run: PieceRun, markup: str, dsml: int) -> PieceRun:
    """``markup`` (text the format writes) with each ``｜DSML｜`` marker given as its id, as the
    reference's ``encode`` of the same string gives it when the tokenizer holds the marker as a
    special token (and as matching the added token gives it otherwise)."""
    for k, chunk in enumerate(markup.split(DSML)):
        if k:
            run.token(dsml)
        run.text(chunk)
    return run


def _declared_tools_text(turn: Turn) -> str:
    """The tools section of a ``tool_declare`` message (a JSON list of ``{"type", "function"}``)."""
    try:
        payload: object = json.loads(turn.plain())
        specs = [cast("Mapping[str, object]", tool)["function"] for tool in cast("list[object]", payload)]
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        raise ValueError(
            f"{turn.where}: a tool declaration is a JSON list of {{'type': 'function', 'function': spec}} "
            f"(create_conversation_prefix_with_tools writes one): {exc}"
        ) from None
    return _V41_TOOLS_TEXT.format(schemas="\n".join(json.dumps(spec, ensure_ascii=False) for spec in specs))


def _is_user_turn(turn: Turn) -> bool:
    return turn.role in _USER_TURN_ROLES


def _v41_turns(turns: Sequence[Turn]) -> list[Turn]:
    """The conversation in the template's turns, one entry per message (indices kept).

    A ``tool_declare`` message is folded into the leading system message (or becomes one); a run
    of tool and user messages is one user turn: its first message carries the whole text (tool
    results as ``<tool_result>`` blocks, sorted into the order of the calls), the rest are empty.
    """
    out = list(turns)
    for k, turn in enumerate(out):
        if turn.role != "tool_declare":
            continue
        tools = _declared_tools_text(turn)
        if k == 0:
            out[0] = attrs.evolve(turn, role="system", text="", parts=None, declared="\n\n" + tools)
        elif k == 1 and out[0].role == "system":
            out[0] = attrs.evolve(out[0], text=out[0].plain(), parts=None, declared="\n\n" + tools)
            out[1] = attrs.evolve(turn, text="", parts=None)
        else:
            raise ValueError(
                f"{turn.where}: DeepSeek V4.1 tool declarations come first or right after the first "
                "system message (use create_conversation_prefix_with_tools)"
            )
    order: dict[str, int] = {}
    k = 0
    while k < len(out):
        if out[k].calls:
            order = {call_id: n for n, c in enumerate(out[k].calls) if (call_id := c.get("id"))}
        if not _is_user_turn(out[k]):
            k += 1
            continue
        end = k
        while end + 1 < len(out) and _is_user_turn(out[end + 1]):
            end += 1
        group = out[k : end + 1]
        results = iter(
            sorted((t for t in group if t.role == "tool"), key=lambda t: order.get(t.call_id or "", 0))
        )
        blocks = [
            f"<tool_result>{t.plain()}</tool_result>" if t.role == "tool" else t.plain()
            for t in (next(results) if t.role == "tool" else t for t in group)
        ]
        out[k] = attrs.evolve(out[k], text="\n\n".join(blocks), parts=None)
        for rest in range(k + 1, end + 1):
            out[rest] = attrs.evolve(out[rest], text="", parts=None)
        k = end + 1
    return out


class DeepSeekV41Renderer(BaseRenderer):
    """DeepSeek V4.1 in thinking mode, high reasoning effort (the chat template's defaults).

    Every prompt opens with ``<｜System｜>Reasoning Effort: 75 (…)``, the system text following.
    Reasoning is kept in the assistant messages after the last user turn (tool results and later
    system messages count as user turns) and dropped before it, unless tools are declared; so
    this renderer does **not** extend prefixes. ``strip_thinking_from_history=False`` keeps all
    reasoning (``deepseekv4_1_preserve_thinking``) and extends prefixes.

    Tools are declared with :meth:`create_conversation_prefix_with_tools`: a ``tool_declare``
    message, written into the system turn.

    Example::

        r = DeepSeekV41Renderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # <｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (…)\\n\\n
        #   <｜User｜>2+2?<｜Assistant｜><think>
    """

    name = "deepseekv4_1"
    reasoning_effort: ClassVar[int | None] = 75
    """The effort budget (1-100) written into the system turn; ``None`` is chat mode."""

    def __init__(self, tokenizer: Tokenizer, *, strip_thinking_from_history: bool = True) -> None:
        super().__init__(tokenizer)
        tok = self.special_token
        self._bos, self._eos = tok(BOS), tok(EOS)
        self._system, self._user, self._assistant = tok(SYSTEM), tok(USER), tok(ASSISTANT)
        self._think, self._think_close = tok(THINK_OPEN), tok(THINK_CLOSE)
        self._dsml = tok(DSML)
        self.strip_thinking_from_history = strip_thinking_from_history

    @property
    def _thinking(self) -> bool:
        return self.reasoning_effort is not None

    @property
    def extends_prefix(self) -> bool:
        return not (self._thinking and self.strip_thinking_from_history)

    def get_stop_sequences(self) -> StopCondition:
        return [self._eos]

    def turn_start_index(self, messages: Sequence[Message]) -> int:
        """A system message after the first counts as a user turn, as in the template."""
        starts = (
            k for k, m in enumerate(messages) if m["role"] == "user" or (m["role"] == "system" and k > 0)
        )
        return max(starts, default=-1) + 1

    def message_weights(self, messages: Sequence[Message], train_on_what: TrainOnWhat) -> list[float]:
        """A leading ``tool_declare`` message is the system turn, and weighted as one."""
        if messages and messages[0]["role"] == "tool_declare":
            messages = [cast("Message", {**messages[0], "role": "system"}), *messages[1:]]
        return base_message_weights(messages, train_on_what, turn_start=self.turn_start_index(messages[:-1]))

    # ------------------------------------------------------------------ rendering

    def _opening(self, run: PieceRun, role: str) -> PieceRun:
        """What the first message starts with: ``<｜System｜>`` and, in thinking mode, the effort line."""
        if self.reasoning_effort is not None:
            return run.token(self._system).text(_EFFORT_LINE.format(budget=self.reasoning_effort))
        return run.token(self._system) if role == "system" else run

    def _system_parts(self, turn: Turn, k: int) -> MessageParts:
        body = _dsml_run(PieceRun().text(turn.plain()), turn.declared, self._dsml).pieces()
        if k > 0 or self.reasoning_effort is None:
            return MessageParts(((self._system,),), body)
        # The effort line and the system text are one string to the reference's tokenizer (BPE merges
        # across "\n\n"); a token that straddles them belongs to the header.
        effort = _EFFORT_LINE.format(budget=self.reasoning_effort)
        first, rest = (body[0], body[1:]) if body and isinstance(body[0], str) else ("", body)
        tokens = [self._system, *self.encode_texts([effort + first])[0]]
        prefix_len = len(SYSTEM) + len(effort)
        split = 0
        while split < len(tokens) and len(self.decode(tokens[:split])) < prefix_len:
            split += 1
        completion: tuple[Piece, ...] = ((tuple(tokens[split:]),) if split < len(tokens) else ()) + rest
        return MessageParts((tuple(tokens[:split]),), completion)

    def _assistant_header(self, turns: Sequence[Turn], k: int, drop_through: int) -> tuple[Piece, ...]:
        keeps = self._thinking and k > drop_through
        prev = turns[k - 1] if k > 0 else None
        follows_user_turn = prev is not None and (_is_user_turn(prev) or (prev.role == "system" and k > 1))
        run = self._opening(PieceRun(), "assistant") if k == 0 else PieceRun()
        if follows_user_turn:
            run.token(self._assistant, self._think if keeps else self._think_close)
        return run.pieces()

    def _message_parts(self, turns: Sequence[Turn], k: int, drop_through: int) -> MessageParts:
        turn = turns[k]
        if turn.role == "system":
            return self._system_parts(turn, k)
        if turn.role == "tool_declare":
            return MessageParts((), ())
        if _is_user_turn(turn):
            if k > 0 and _is_user_turn(turns[k - 1]):
                return MessageParts((), ())
            header = (
                (self._opening(PieceRun(), turn.role) if k == 0 else PieceRun()).token(self._user).pieces()
            )
            return MessageParts(header, (turn.text,))
        if turn.role != "assistant":
            raise ValueError(
                f"{turn.where}: DeepSeek V4.1 renders system, user, assistant, tool and tool_declare messages"
            )
        keeps = self._thinking and k > drop_through
        body = PieceRun().text((turn.reasoning + THINK_CLOSE if keeps else "") + turn.answer)
        if turn.calls:
            self._calls_block(body, turn.calls)
        completion = body.token(self._eos).pieces()
        return MessageParts(self._assistant_header(turns, k, drop_through), completion)

    def _calls_block(self, run: PieceRun, calls: Sequence[ToolCall]) -> None:
        """``\\n\\n<｜DSML｜ calls>…</｜DSML｜ calls>`` onto ``run``: the markers are the format's, one
        id each; argument values stay text, as every user-written string does."""
        for n, call in enumerate(calls):
            _dsml_run(run, f"\n\n{_DSML_CALLS_OPEN}\n" if n == 0 else "\n", self._dsml)
            _dsml_run(run, f'<{DSML} invoke name="{call["name"]}">\n', self._dsml)
            for m, (key, value) in enumerate(_argument_dict(call["arguments"]).items()):
                kind = "true" if isinstance(value, str) else "false"
                opening = f'<{DSML} parameter name="{key}" string="{kind}">'
                _dsml_run(run, ("\n" if m else "") + opening, self._dsml)
                run.text(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
                _dsml_run(run, f"</{DSML} parameter>", self._dsml)
            _dsml_run(run, f"\n</{DSML} invoke>", self._dsml)
        _dsml_run(run, f"\n{_DSML_CALLS_CLOSE}", self._dsml)

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        raw = read_turns(messages)
        turns = _v41_turns(raw)
        drop_through = -1
        if self._thinking and self.strip_thinking_from_history and all(t.role != "tool_declare" for t in raw):
            drop_through = max(
                (k for k, t in enumerate(turns) if _is_user_turn(t) or (t.role == "system" and k > 0)),
                default=-1,
            )
        parts = tuple(self._message_parts(turns, k, drop_through) for k in range(len(turns)))
        gen: tuple[Piece, ...] = ()
        if generation:
            # The template's header for a message that does not exist yet: reasoning always kept.
            gen = self._assistant_header(
                [*turns, Turn(len(turns), "assistant", "", None, (), None)], len(turns), -1
            )
        return Rendering(prefix=((self._bos,),), messages=parts, generation_header=gen)

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[Mapping[str, object]], system_prompt: str = ""
    ) -> list[Message]:
        """The system prompt (if any), then a ``tool_declare`` message listing the tools.

        Both render into one ``<｜System｜>`` turn; the declaration is kept as its own message so
        that the renderer knows tools are declared (reasoning is then kept in history).

        Example::

            prefix = r.create_conversation_prefix_with_tools([weather_tool], "You are terse.")
            [m["role"] for m in prefix]  # ["system", "tool_declare"]
        """
        out: list[Message] = []
        if system_prompt:
            out.append(Message(role="system", content=system_prompt))
        if tools:
            payload = [{"type": "function", "function": dict(tool)} for tool in tools]
            out.append(Message(role="tool_declare", content=json.dumps(payload)))
        return out

    # ------------------------------------------------------------------ parsing

    def _tool_calls(self, block: str) -> tuple[list[ToolCall], list[dict[str, str]]]:
        body = block.removeprefix("\n\n").removeprefix(_DSML_CALLS_OPEN).removesuffix(_DSML_CALLS_CLOSE)
        invokes = list(_DSML_INVOKE_RE.finditer(body))
        if not invokes or _DSML_INVOKE_RE.sub("", body).strip():
            return [], [unparsed_entry(block, "Invalid DSML: malformed invoke")]
        calls: list[ToolCall] = []
        unparsed: list[dict[str, str]] = []
        for invoke in invokes:
            name, params = invoke.group(1), invoke.group(2)
            arguments: dict[str, object] = {}
            try:
                if not name.strip():
                    raise ValueError("empty function name")
                if _DSML_PARAM_RE.sub("", params).strip():
                    raise ValueError("text outside parameters")
                for param in _DSML_PARAM_RE.finditer(params):
                    key, is_string, value = param.groups()
                    if not key.strip():
                        raise ValueError("empty parameter name")
                    if key in arguments:
                        raise ValueError(f"duplicate parameter {key!r}")
                    arguments[key] = value if is_string == "true" else cast("object", json.loads(value))
            except ValueError as exc:  # json.JSONDecodeError included
                unparsed.append(unparsed_entry(invoke.group(0), f"Invalid DSML: {exc}"))
                continue
            calls.append(ToolCall(name=name, arguments=json.dumps(arguments)))
        return calls, unparsed

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """Cut at ``<｜end▁of▁sentence｜>``; read reasoning and the DSML calls block.

        In thinking mode the prompt's ``<think>`` is put back first. A truncated response comes back
        unparsed, ``MALFORMED``; a bad call, text after the calls block, or a stray DSML marker goes
        to ``unparsed_tool_calls``.

        Example::

            r.parse(tokenizer.encode("two and two</think>4<｜end▁of▁sentence｜>"))
            # ({"role": "assistant", "content": "4", "thinking": "two and two"}, STOP_SEQUENCE)
        """
        tokens = list(tokens)
        if self._thinking and self._think_close in tokens and tokens[0] != self._think:
            tokens = [self._think, *tokens]
        return parse_to_eos(tokens, self._eos, self.decode, self._read_reply)

    def _read_reply(self, content: str) -> Message:
        """The assistant message in a reply's text: the DSML calls block (text after it, or a
        stray marker, is unparsed) and ``<think>`` blocks."""
        block = _DSML_BLOCK_RE.search(content)
        calls, unparsed = self._tool_calls(block.group(0)) if block is not None else ([], [])
        if block is not None:
            after = content[block.end() :]
            if after.strip():
                unparsed.append(unparsed_entry(after, "Invalid DSML: output after calls block"))
            content = content[: block.start()]
        dangling = dangling_block(content, _DSML_CALLS_OPEN, _DSML_CALLS_CLOSE)
        if dangling is None and DSML in content:
            dangling = unparsed_entry(content, "Invalid DSML: marker outside a calls block")
        if dangling is not None:
            unparsed.append(dangling)
        return parsed_message(content, calls, unparsed)


class DeepSeekV41LowReasoningRenderer(DeepSeekV41Renderer):
    """DeepSeek V4.1 in thinking mode, low reasoning effort (``Reasoning Effort: 50``).

    Example::

        DeepSeekV41LowReasoningRenderer(tokenizer).build_generation_prompt(convo)
    """

    name = "deepseekv4_1_low_reasoning"
    reasoning_effort = 50


class DeepSeekV41MaxReasoningRenderer(DeepSeekV41Renderer):
    """DeepSeek V4.1 in thinking mode, max reasoning effort (``Reasoning Effort: 100``).

    Example::

        DeepSeekV41MaxReasoningRenderer(tokenizer).build_generation_prompt(convo)
    """

    name = "deepseekv4_1_max_reasoning"
    reasoning_effort = 100


class DeepSeekV41DisableThinkingRenderer(DeepSeekV41Renderer):
    """DeepSeek V4.1 in chat mode: no effort line, every assistant header ends ``</think>``; extends
    prefixes. Reasoning given in a message is not rendered.

    Example::

        DeepSeekV41DisableThinkingRenderer(tokenizer).build_generation_prompt(
            [{"role": "user", "content": "2+2?"}])
        # <｜begin▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜></think>
    """

    name = "deepseekv4_1_disable_thinking"
    reasoning_effort = None


def v41_preserve_thinking(tokenizer: Tokenizer) -> DeepSeekV41Renderer:
    renderer = DeepSeekV41Renderer(tokenizer, strip_thinking_from_history=False)
    renderer.name = "deepseekv4_1_preserve_thinking"
    return renderer
