"""DeepSeek V3.1 and V4.1: ``<｜User｜>…<｜Assistant｜>…<｜end▁of▁sentence｜>``, no separators.

**V3.1** (``deepseekv3``, ``deepseekv3_disable_thinking``, ``deepseekv3_thinking``): a BOS, then a
leading system message as bare text, each user message after ``<｜User｜>`` and each assistant
message after ``<｜Assistant｜>``. Thinking mode writes reasoning as ``<think>…</think>`` before the
answer and prompts with ``<｜Assistant｜><think>``; chat mode puts ``</think>`` in every assistant
header. Tool calls are ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{json}
<｜tool▁call▁end｜><｜tool▁calls▁end｜>``; a tool result is ``<｜tool▁output▁begin｜>…
<｜tool▁output▁end｜>`` and the assistant's reply to it has no header at all.

**V4.1** (``deepseekv4_1*``): a ``<｜System｜>`` turn that, in thinking mode, always opens with a
reasoning-effort line; each assistant header is ``<｜Assistant｜><think>`` (reasoning kept) or
``<｜Assistant｜></think>`` (chat mode, or reasoning dropped from history). Tool results are
``<tool_result>…</tool_result>`` blocks in a user turn, sorted into the order of the calls; a run
of tool and user messages is one user turn, its texts joined by a blank line. Tool calls are DSML
blocks, one ``parameter`` per argument key::

    <｜DSML｜ calls>
    <｜DSML｜ invoke name="get_weather">
    <｜DSML｜ parameter name="city" string="true">Paris</｜DSML｜ parameter>
    </｜DSML｜ invoke>
    </｜DSML｜ calls>

Every quirk of the Tinker Cookbook 0.6.1 renderers (the test oracle) is kept, token for token: a
V3 assistant message with empty content has no end-of-sentence token, a V3 assistant reply to a
tool result keeps its reasoning, V4.1's effort line is tokenized together with the system text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

import attrs

from tempering.renderers._base import BaseRenderer, MessageParts, ParseTermination, Piece, Rendering
from tempering.renderers._deepseek_parse import (
    dangling_block,
    parse_to_eos,
    parsed_message,
    tool_field,
    unparsed_entry,
)
from tempering.renderers._deepseek_turns import (
    ASSISTANT,
    BOS,
    CALL_BEGIN,
    CALL_END,
    CALL_SEP,
    CALLS_BEGIN,
    CALLS_END,
    EOS,
    OUTPUT_BEGIN,
    OUTPUT_END,
    THINK_BLOCK_RE,
    THINK_CLOSE,
    THINK_OPEN,
    USER,
    Turn,
    read_turns,
)
from tempering.renderers._pieces import PieceRun
from tempering.renderers.deepseek_v4 import (
    DeepSeekV41DisableThinkingRenderer,
    DeepSeekV41LowReasoningRenderer,
    DeepSeekV41MaxReasoningRenderer,
    DeepSeekV41Renderer,
    v41_preserve_thinking,
)
from tempering_protocols import Message, StopCondition, Tokenizer, ToolCall

__all__ = [
    "DeepSeekV3Renderer",
    "DeepSeekV3ThinkingRenderer",
    "DeepSeekV41DisableThinkingRenderer",
    "DeepSeekV41LowReasoningRenderer",
    "DeepSeekV41MaxReasoningRenderer",
    "DeepSeekV41Renderer",
]

# ----------------------------------------------------------------------------- DeepSeek V3.1

_V3_CALLS_RE = re.compile(re.escape(CALLS_BEGIN) + r"(.*?)" + re.escape(CALLS_END), re.DOTALL)
_V3_CALL_RE = re.compile(
    re.escape(CALL_BEGIN) + r"(\w+)" + re.escape(CALL_SEP) + r"(.*?)" + re.escape(CALL_END), re.DOTALL
)
_V3_STRIP_CALLS_RE = re.compile(r"\s*" + re.escape(CALLS_BEGIN) + r".*?" + re.escape(CALLS_END), re.DOTALL)

_V3_TOOLS_TEXT = """

## Tools
You have access to the following tools:

{blocks}

IMPORTANT: ALWAYS adhere to this exact format for tool use:
<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Where:
- `tool_call_name` must be an exact match to one of the available tools
- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema
- For multiple tool calls, chain them directly without separators or spaces"""
"""DeepSeek V3.1's tool declaration, appended to the system prompt (its model card's format)."""


class DeepSeekV3Renderer(BaseRenderer):
    """DeepSeek V3.1 in chat (non-thinking) mode; extends prefixes.

    Every assistant header is ``<｜Assistant｜></think>``, which tells the model to answer without
    reasoning; reasoning given in a message is dropped (``<think>…</think>`` in a string too). A
    system message may only come first (it is written without a role token). An assistant message
    with empty content gets no ``<｜end▁of▁sentence｜>``, as in the cookbook.

    Example::

        r = DeepSeekV3Renderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # <｜begin▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜></think>
    """

    name = "deepseekv3"
    strip_thinking_from_history: bool = True

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        tok = self.special_token
        self._bos, self._eos, self._user, self._assistant = tok(BOS), tok(EOS), tok(USER), tok(ASSISTANT)
        self._think, self._think_close = tok(THINK_OPEN), tok(THINK_CLOSE)
        self._calls_begin, self._calls_end = tok(CALLS_BEGIN), tok(CALLS_END)
        self._call_begin, self._call_end, self._call_sep = tok(CALL_BEGIN), tok(CALL_END), tok(CALL_SEP)
        self._output_begin, self._output_end = tok(OUTPUT_BEGIN), tok(OUTPUT_END)

    @property
    def extends_prefix(self) -> bool:
        return True

    def get_stop_sequences(self) -> StopCondition:
        return [self._eos]

    # ------------------------------------------------------------------ rendering

    def _assistant_body(self, turn: Turn, run: PieceRun, *, strip: bool) -> None:
        """Content parts in order, thinking as ``<think>…</think>`` unless stripped; a string verbatim."""
        if turn.parts is None:
            run.text(turn.text)
            return
        for kind, value in turn.parts:
            if kind == "text":
                run.text(value)
            elif not strip:
                run.token(self._think).text(value).token(self._think_close)

    def _parts(self, turns: Sequence[Turn], k: int) -> MessageParts:
        """A message as the cookbook's V3 base renders it (before the mode's own changes)."""
        turn = turns[k]
        follows_tool = k > 0 and turns[k - 1].role == "tool"
        header: tuple[Piece, ...] = ()
        run = PieceRun()
        if turn.role == "system":
            if k != 0:
                raise ValueError(
                    f"{turn.where}: DeepSeek V3 renders a system message only as the first message"
                )
            run.text(turn.plain())
        elif turn.role == "user":
            header = ((self._user,),)
            run.text(turn.plain())
        elif turn.role == "assistant":
            is_last = k == len(turns) - 1
            strip = self.strip_thinking_from_history and not turn.calls and not is_last
            self._assistant_body(turn, run, strip=strip)
            header = () if follows_tool else ((self._assistant,),)
        elif turn.role == "tool":
            header = ((self._output_begin,),)
            run.text(turn.plain()).token(self._output_end)
        else:
            raise ValueError(f"{turn.where}: DeepSeek V3 renders system, user, assistant and tool messages")
        if turn.calls:
            run.token(self._calls_begin)
            for call in turn.calls:
                run.token(self._call_begin).text(call["name"]).token(self._call_sep)
                run.text(call["arguments"]).token(self._call_end)
            run.token(self._calls_end)
        if turn.role == "assistant" and turn.has_content:
            run.token(self._eos)
        return MessageParts(header, run.pieces())

    def _message_parts(self, turns: Sequence[Turn], k: int) -> MessageParts:
        """Chat mode: reasoning dropped and ``</think>`` closing the header, except after a tool result."""
        turn = turns[k]
        if turn.role != "assistant" or (k > 0 and turns[k - 1].role == "tool"):
            return self._parts(turns, k)
        answer = turn.answer if turn.parts is not None else THINK_BLOCK_RE.sub("", turn.text)
        plain = attrs.evolve(turn, text=answer, parts=None)
        parts = self._parts([*turns[:k], plain, *turns[k + 1 :]], k)
        return MessageParts((*parts.header, (self._think_close,)), parts.completion)

    def _generation_header(self, turns: Sequence[Turn]) -> tuple[Piece, ...]:
        if turns and turns[-1].role == "tool":
            return ()
        return ((self._assistant,), (self._think_close,))

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        turns = read_turns(messages)
        parts = tuple(self._message_parts(turns, k) for k in range(len(turns)))
        gen = self._generation_header(turns) if generation else ()
        return Rendering(prefix=((self._bos,),), messages=parts, generation_header=gen)

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[Mapping[str, object]], system_prompt: str = ""
    ) -> list[Message]:
        """One system message: the prompt, then a ``## Tools`` section listing each tool.

        Example::

            r.create_conversation_prefix_with_tools([weather_tool], "You are terse.")
            # [{"role": "system", "content": "You are terse.\\n\\n## Tools\\nYou have access to..."}]
        """
        text = ""
        if tools:
            blocks = [
                f"### {tool_field(tool, 'name')}\nDescription: {tool_field(tool, 'description')}\n\n"
                f"Parameters: {json.dumps(tool_field(tool, 'parameters'))}"
                for tool in tools
            ]
            text = _V3_TOOLS_TEXT.format(blocks="\n".join(blocks))
        return [Message(role="system", content=system_prompt + text)]

    # ------------------------------------------------------------------ parsing

    def _restore_prefill(self, tokens: list[int]) -> list[int]:
        return tokens

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """Cut at ``<｜end▁of▁sentence｜>``; read the tool-call block and ``<think>`` blocks.

        A response with no end-of-sentence token is truncated: its text comes back unparsed,
        ``MALFORMED``. A tool call whose arguments are not JSON goes to ``unparsed_tool_calls``.

        Example::

            r.parse(tokenizer.encode("4<｜end▁of▁sentence｜>"))
            # ({"role": "assistant", "content": "4"}, ParseTermination.STOP_SEQUENCE)
        """
        return parse_to_eos(self._restore_prefill(list(tokens)), self._eos, self.decode, self._read_reply)

    def _read_reply(self, content: str) -> Message:
        """The assistant message in a reply's text: its tool-call block and ``<think>`` blocks."""
        calls: list[ToolCall] = []
        unparsed: list[dict[str, str]] = []
        block = _V3_CALLS_RE.search(content)
        if block is not None:
            for match in _V3_CALL_RE.finditer(block.group(1)):
                arguments = match.group(2).strip()
                try:
                    json.loads(arguments)
                except json.JSONDecodeError as exc:
                    unparsed.append(unparsed_entry(match.group(0), f"Invalid JSON: {exc}"))
                    continue
                calls.append(ToolCall(name=match.group(1), arguments=arguments))
        for open_marker, close_marker in ((CALLS_BEGIN, CALLS_END), (CALL_BEGIN, CALL_END)):
            dangling = dangling_block(content, open_marker, close_marker)
            if dangling is not None:
                unparsed.append(dangling)
                break
        if calls or unparsed:
            content = _V3_STRIP_CALLS_RE.sub("", content).strip()
        return parsed_message(content, calls, unparsed)


class DeepSeekV3ThinkingRenderer(DeepSeekV3Renderer):
    """DeepSeek V3.1 in thinking mode: the prompt ends ``<｜Assistant｜><think>``.

    As in the Hugging Face template, reasoning is dropped from earlier assistant turns (whose
    header then ends in ``</think>``) unless the turn called tools, so this renderer does **not**
    extend prefixes; the last assistant message keeps its reasoning, or gets an empty
    ``<think></think>`` block. A reply to a tool result is prompted without ``<think>``.
    ``strip_thinking_from_history=False`` keeps every turn's reasoning and extends prefixes.

    Example::

        r = DeepSeekV3ThinkingRenderer(tokenizer)
        r.build_supervised_example(
            [{"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": "4", "thinking": "two and two"}])
        # …<｜Assistant｜><think>two and two</think>4<｜end▁of▁sentence｜>
    """

    name = "deepseekv3_thinking"

    def __init__(self, tokenizer: Tokenizer, *, strip_thinking_from_history: bool = True) -> None:
        super().__init__(tokenizer)
        self.strip_thinking_from_history = strip_thinking_from_history

    @property
    def extends_prefix(self) -> bool:
        return not self.strip_thinking_from_history

    def _message_parts(self, turns: Sequence[Turn], k: int) -> MessageParts:
        parts = self._parts(turns, k)
        turn = turns[k]
        if turn.role != "assistant" or (k > 0 and turns[k - 1].role == "tool"):
            return parts
        if k < len(turns) - 1:
            if self.strip_thinking_from_history:
                return MessageParts((*parts.header, (self._think_close,)), parts.completion)
            return parts
        if turn.has_content and not turn.has_thinking:
            return MessageParts(parts.header, ((self._think, self._think_close), *parts.completion))
        return parts

    def _generation_header(self, turns: Sequence[Turn]) -> tuple[Piece, ...]:
        if turns and turns[-1].role == "tool":
            return ()
        return ((self._assistant,), (self._think,))

    def _restore_prefill(self, tokens: list[int]) -> list[int]:
        """The prompt's ``<think>`` is not in the sampled tokens: put it back before parsing."""
        if (not tokens or tokens[0] != self._think) and self._think_close in tokens:
            return [self._think, *tokens]
        return tokens


def _v3_alias(tokenizer: Tokenizer) -> DeepSeekV3Renderer:
    renderer = DeepSeekV3Renderer(tokenizer)
    renderer.name = "deepseekv3_disable_thinking"
    return renderer


RENDERERS = {
    "deepseekv3": DeepSeekV3Renderer,
    "deepseekv3_disable_thinking": _v3_alias,
    "deepseekv3_thinking": DeepSeekV3ThinkingRenderer,
    "deepseekv4_1": DeepSeekV41Renderer,
    "deepseekv4_1_low_reasoning": DeepSeekV41LowReasoningRenderer,
    "deepseekv4_1_max_reasoning": DeepSeekV41MaxReasoningRenderer,
    "deepseekv4_1_disable_thinking": DeepSeekV41DisableThinkingRenderer,
    "deepseekv4_1_preserve_thinking": v41_preserve_thinking,
}
"""This module's registry names (see :data:`tempering.renderers.RENDERERS`)."""
