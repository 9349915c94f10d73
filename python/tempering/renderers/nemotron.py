"""Nemotron 3 (Nano, Super, Ultra) and Nemotron 3.5: ChatML with think blocks and XML tool calls.

The format is ``<|im_start|>role\\n…<|im_end|>`` with messages joined by a newline, like Qwen3.5,
but Nemotron's chat templates differ in ways that change tokens:

- a system message is always written, empty when the conversation has none;
- every assistant turn whose reasoning is not shown opens with ``<think></think>`` (history
  included), and the reasoning that is shown is ``<think>\\n…\\n</think>\\n`` (Nano/Super) or
  ``<think>\\n…</think>`` (Ultra, 3.5);
- tool declarations are XML (``<function><name>…``) after the system prompt, tool calls are
  ``<tool_call>\\n<function=name>\\n<parameter=k>\\nv\\n</parameter>\\n</function>\\n</tool_call>\\n``,
  and a run of tool results shares one ``user`` turn.

The Tinker Cookbook (0.6.1) is the reference, token for token. Its thinking prompt ends with
``<think>\\n`` while a turn that did not reason is written ``<think></think>``: Nemotron's own
template disagrees with itself there, so for such a turn the prompt is not a prefix of the
supervised example and nothing of the prompt is masked (the reference does the same).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, cast

import attrs

from tempering.renderers._base import BaseRenderer, MessageParts, ParseTermination, Piece, Rendering
from tempering.renderers._base import message_weights as weights_by_mode
from tempering.renderers._conversation import last_user_index
from tempering.renderers._nemotron_format import (
    CONTROL_TOKENS,
    EMPTY_SYSTEM_MESSAGE,
    INJECTED_SYSTEM,
    TOOLS_HEADER,
    TOOLS_INSTRUCTIONS,
    Turn,
    argument_text,
    injects_system,
    parse_body,
    read_turn,
    tool_declaration,
)
from tempering.renderers._pieces import MarkupRun
from tempering.renderers.llama3 import parse_at_stop_token
from tempering_protocols import Message, StopCondition, Tokenizer, TrainOnWhat

__all__ = [
    "Nemotron3DisableThinkingRenderer",
    "Nemotron3LowThinkingRenderer",
    "Nemotron3PreserveThinkingRenderer",
    "Nemotron3Renderer",
    "Nemotron3UltraDisableThinkingRenderer",
    "Nemotron3UltraMediumThinkingRenderer",
    "Nemotron3UltraPreserveThinkingRenderer",
    "Nemotron3UltraRenderer",
]

# ------------------------------------------------------------------------------ renderers


class Nemotron3Renderer(BaseRenderer):
    """Nemotron 3 Nano / Super with reasoning on (the template's ``enable_thinking=True``).

    The generation prompt ends with ``<think>\\n``. An assistant turn's reasoning is written
    ``<think>\\n…\\n</think>\\n`` before its text; before the last user message it is dropped and the
    turn opens with ``<think></think>`` (the template's ``truncate_history_thinking``), so this
    renderer does not extend prefixes. A conversation without a system message gets an empty
    one, as the template writes it (the rendering then has one more message than the
    conversation: that system turn, trained like a system message).

    Example::

        r = Nemotron3Renderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # <|im_start|>system\\n<|im_end|>\\n<|im_start|>user\\n2+2?<|im_end|>\\n
        # <|im_start|>assistant\\n<think>\\n
        r.parse_response(tokenizer.encode("two and two\\n</think>\\n4<|im_end|>"))
        # ({"role": "assistant", "content": "4", "thinking": "two and two"}, True)
    """

    name = "nemotron3"

    ultra_format: ClassVar[bool] = False
    """Ultra / 3.5 framing: ``<think>\\n…</think>`` with no separators, tool calls after one newline."""
    effort_note: ClassVar[str] = ""
    """Appended to the last user message (low / medium reasoning effort)."""
    effort_note_needs_str: ClassVar[bool] = False

    def __init__(self, tokenizer: Tokenizer, *, strip_thinking_from_history: bool = True) -> None:
        super().__init__(tokenizer)
        self.strip_thinking_from_history = strip_thinking_from_history
        self._im_start = self.special_token("<|im_start|>")
        self._im_end = self.special_token("<|im_end|>")
        self._think_open = self.special_token("<think>")
        self._think_close = self.special_token("</think>")
        self._think_prefix = (self._think_open, *self.constant("\n"))
        ids: dict[str, int] = {}
        for token in CONTROL_TOKENS:
            found = list(self.tokenizer.encode(token, add_special_tokens=False))
            if len(found) == 1 and self.decode(found) == token:
                ids[token] = found[0]
        self._control_ids = ids
        self._control_re = re.compile("(" + "|".join(re.escape(t) for t in ids) + ")")

    def _split(self, markup: str) -> list[Piece]:
        return [
            (self._control_ids[chunk],) if chunk in self._control_ids else chunk
            for chunk in self._control_re.split(markup)
            if chunk
        ]

    def _run(self) -> MarkupRun:
        return MarkupRun(self._split)

    @property
    def extends_prefix(self) -> bool:
        return not self.strip_thinking_from_history

    @property
    def generation_think(self) -> str:
        """What the generation prompt opens the assistant turn with: ``<think>\\n``, or a closed
        ``<think></think>`` when thinking is off."""
        return "<think></think>" if self.disables_thinking else "<think>\n"

    def get_stop_sequences(self) -> StopCondition:
        return [self._im_end]

    # ----------------------------------------------------------------------- format hooks

    def _thinking(self, run: MarkupRun, thinking: str) -> None:
        if self.ultra_format:
            run.markup("<think>\n").text(thinking).markup("</think>")
        else:
            run.markup("<think>\n").text(thinking).markup("\n</think>\n")

    def _header_think(self, turn: Turn, historical: bool) -> str:
        """The empty block an assistant header gets when its reasoning is not in the output."""
        if turn.has_thinking and not (historical and self.strip_thinking_from_history):
            return ""
        if self.ultra_format:
            return "<think></think>"
        # Nano/Super: the template cuts history at '</think>' and keeps the newline after it,
        # except in its tool-call branch, which trims the content first.
        if historical and turn.has_thinking and turn.has_nonempty_text_part and not turn.calls:
            return "<think></think>\n"
        return "<think></think>"

    def _tool_calls_separator(self, turn: Turn) -> str:
        if self.ultra_format:
            return "\n"
        # Nano/Super: the thinking block already ended with a newline when no text follows it.
        return "" if turn.has_thinking_part and not turn.has_nonempty_text_part else "\n"

    # ----------------------------------------------------------------------- rendering

    def _with_effort(self, turn: Turn) -> Turn:
        if not self.effort_note:
            return turn
        if isinstance(turn.content, str):
            return attrs.evolve(turn, content=turn.content + self.effort_note)
        if self.effort_note_needs_str:
            raise ValueError(
                f"{turn.where()}: the {self.name} renderer appends {self.effort_note.strip()!r} to the "
                "last user message, which must have str content"
            )
        return attrs.evolve(turn, content=(*turn.content, ("text", self.effort_note)))

    def _header(self, idx: int, role: str, suffix: str) -> tuple[Piece, ...]:
        run = self._run()
        if idx > 0:
            run.text("\n")
        return run.markup(f"<|im_start|>{role}\n").markup(suffix).pieces()

    def _content_text(self, run: MarkupRun, turn: Turn) -> None:
        """String content, trimmed as the template trims it.

        The tool block :meth:`create_conversation_prefix_with_tools` writes into a system message
        is the format's own markup: its ``<tool_call>`` tags are the control tokens the template's
        output has there, not text a user typed.
        """
        content = cast("str", turn.content).strip()
        start = content.find(TOOLS_HEADER) if turn.role == "system" else -1
        end = content.find(TOOLS_INSTRUCTIONS, start) if start >= 0 else -1
        if end < 0:
            run.text(content)
            return
        end += len(TOOLS_INSTRUCTIONS)
        run.text(content[:start]).markup(content[start:end]).text(content[end:])

    def _completion(self, turn: Turn, historical: bool, close: bool) -> tuple[Piece, ...]:
        run = self._run()
        if turn.role == "tool":
            run.markup("<tool_response>\n")
        if isinstance(turn.content, str):
            self._content_text(run, turn)
        else:
            strip = self.strip_thinking_from_history and turn.role == "assistant" and historical
            for kind, value in turn.content:
                if kind == "text":
                    run.text(value)
                elif not strip:
                    self._thinking(run, value)
        if turn.role == "tool":
            run.markup("\n</tool_response>\n")
        if turn.calls is not None:
            run.markup(self._tool_calls_separator(turn))
            for call in turn.calls:
                run.markup("<tool_call>\n<function=").text(call.name).markup(">\n")
                for key, value in call.arguments.items():
                    run.markup("<parameter=").text(key).markup(">\n")
                    run.text(argument_text(value)).markup("\n</parameter>\n")
                run.markup("</function>\n</tool_call>\n")
        if close:
            run.markup("<|im_end|>")
        return run.pieces()

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        turns = [read_turn(m, i) for i, m in enumerate(messages)]
        if injects_system(messages):
            turns.insert(0, INJECTED_SYSTEM)
        last_user = max((k for k, t in enumerate(turns) if t.role == "user"), default=-1)
        parts: list[MessageParts] = []
        for k, turn in enumerate(turns):
            if k == last_user:
                turn = self._with_effort(turn)
            historical = k < last_user
            prev_tool = k > 0 and turns[k - 1].role == "tool"
            next_tool = k + 1 < len(turns) and turns[k + 1].role == "tool"
            header: tuple[Piece, ...] = ()
            if not (turn.role == "tool" and prev_tool):
                role = "user" if turn.role == "tool" else turn.role
                suffix = self._header_think(turn, historical) if turn.role == "assistant" else ""
                header = self._header(k, role, suffix)
            close = not (turn.role == "tool" and next_tool)
            parts.append(MessageParts(header, self._completion(turn, historical, close)))
        gen = self._header(len(turns), "assistant", self.generation_think) if generation else ()
        return Rendering(prefix=(), messages=tuple(parts), generation_header=gen)

    def message_weights(self, messages: Sequence[Message], train_on_what: TrainOnWhat) -> list[float]:
        """Weights of the rendered messages: the added empty system message (if any) first.

        It is trained like any system message (``all_messages``, ``all_user_and_system_messages``
        and ``all_tokens`` train its ``<|im_end|>``). ``customized`` needs a ``trainable`` flag on
        every message, which the added one cannot have: give the system message yourself.
        """
        full = list(messages)
        if injects_system(messages):
            if train_on_what == TrainOnWhat.CUSTOMIZED:
                raise ValueError(
                    f"train_on_what=customized with the {self.name} renderer: the conversation has no "
                    "system message, so the format adds an empty one that has no trainable flag; start "
                    "the conversation with {'role': 'system', 'content': '', 'trainable': False}"
                )
            full.insert(0, EMPTY_SYSTEM_MESSAGE)
        return weights_by_mode(full, train_on_what, turn_start=last_user_index(full[:-1]) + 1)

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[Mapping[str, object]], system_prompt: str = ""
    ) -> list[Message]:
        """A system message: the system prompt, then the XML tool declarations and how to call them.

        Example::

            prefix = r.create_conversation_prefix_with_tools([weather_spec], "You are terse.")
            # [{"role": "system", "content": "You are terse.\\n\\n# Tools\\n\\n…<tools>\\n<function>…"}]
        """
        if not tools:
            return [Message(role="system", content=system_prompt)]
        declarations = "\n".join(tool_declaration(t) for t in tools)
        tools_text = f"{TOOLS_HEADER}{declarations}\n</tools>\n\n{TOOLS_INSTRUCTIONS}"
        content = f"{system_prompt}\n\n{tools_text}" if system_prompt else tools_text
        return [Message(role="system", content=content)]

    # ----------------------------------------------------------------------- parsing

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """The assistant message in sampled tokens (cut at ``<|im_end|>``).

        The prompt's prefilled ``<think>\\n`` is put back when the response closes a think block
        without opening one. No ``<|im_end|>`` is a truncated response (``MALFORMED``, the
        decoded text as content); more than one is an error (wrong stop sequences).

        Example::

            message, termination = r.parse(tokenizer.encode("4<|im_end|>"))
            # ({"role": "assistant", "content": "4"}, ParseTermination.STOP_SEQUENCE)
        """
        ids = list(tokens)
        prefix = list(self._think_prefix)
        if ids[: len(prefix)] != prefix and self._think_close in ids:
            ids = prefix + ids
        text, termination = parse_at_stop_token(self, ids, self._im_end, "<|im_end|>")
        if not termination.is_clean:
            return Message(role="assistant", content=text), termination
        return parse_body(text, strip_one_newline=not self.ultra_format), termination


class Nemotron3DisableThinkingRenderer(Nemotron3Renderer):
    """Nemotron 3 Nano / Super with reasoning off (``enable_thinking=False``).

    The generation prompt ends with a closed ``<think></think>``; a trained turn that reasons is
    refused. History renders as in :class:`Nemotron3Renderer`.

    Example::

        Nemotron3DisableThinkingRenderer(tokenizer).build_generation_prompt(convo)
        # …<|im_start|>assistant\\n<think></think>
    """

    name = "nemotron3_disable_thinking"
    disables_thinking = True


class Nemotron3LowThinkingRenderer(Nemotron3Renderer):
    """Nemotron 3 Super with low-effort reasoning (``low_effort=True``).

    ``\\n\\n{reasoning effort: low}`` is appended to the last user message (which must be a str);
    the prompt still ends with ``<think>\\n``.

    Example::

        Nemotron3LowThinkingRenderer(tokenizer).build_generation_prompt([{"role": "user", "content": "hi"}])
        # …<|im_start|>user\\nhi\\n\\n{reasoning effort: low}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n
    """

    name = "nemotron3_low_thinking"
    effort_note = "\n\n{reasoning effort: low}"
    effort_note_needs_str = True


class Nemotron3PreserveThinkingRenderer(Nemotron3Renderer):
    """Nemotron 3 Nano / Super keeping every turn's reasoning (``truncate_history_thinking=False``).

    History renders as the turn did when it was produced, so this renderer extends prefixes
    (multi-turn RL).

    Example::

        Nemotron3PreserveThinkingRenderer(tokenizer).extends_prefix  # True
    """

    name = "nemotron3_preserve_thinking"

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer, strip_thinking_from_history=False)


class Nemotron3UltraRenderer(Nemotron3Renderer):
    """Nemotron 3 Ultra, 3.5 Lightning and 3.5 Super (text only) with reasoning on.

    As :class:`Nemotron3Renderer`, but reasoning is written ``<think>\\n…</think>`` with no newline
    before ``</think>`` nor after it, a turn without shown reasoning always opens with
    ``<think></think>``, and tool calls follow the content after one newline. Image parts are
    refused (tempering's renderers are text only).

    Example::

        r = Nemotron3UltraRenderer(tokenizer)
        r.build_supervised_example([
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "thinking": "add"},
        ])  # …<|im_start|>assistant\\n<think>\\nadd</think>4<|im_end|>
    """

    name = "nemotron3_ultra"
    ultra_format = True


class Nemotron3UltraDisableThinkingRenderer(Nemotron3UltraRenderer):
    """Ultra-format Nemotron with reasoning off: the prompt ends with ``<think></think>``.

    Example::

        Nemotron3UltraDisableThinkingRenderer(tokenizer).build_generation_prompt(convo)
        # …<|im_start|>assistant\\n<think></think>
    """

    name = "nemotron3_ultra_disable_thinking"
    disables_thinking = True


class Nemotron3UltraMediumThinkingRenderer(Nemotron3UltraRenderer):
    """Ultra-format Nemotron with medium-effort reasoning (``medium_effort=True``).

    ``\\n\\n{reasoning effort: efficient}`` is appended to the last user message.

    Example::

        Nemotron3UltraMediumThinkingRenderer(tokenizer).build_generation_prompt(
            [{"role": "user", "content": "hi"}]
        )  # …hi\\n\\n{reasoning effort: efficient}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n
    """

    name = "nemotron3_ultra_medium_thinking"
    effort_note = "\n\n{reasoning effort: efficient}"


class Nemotron3UltraPreserveThinkingRenderer(Nemotron3UltraRenderer):
    """Ultra-format Nemotron keeping every turn's reasoning; extends prefixes.

    Example::

        Nemotron3UltraPreserveThinkingRenderer(tokenizer).extends_prefix  # True
    """

    name = "nemotron3_ultra_preserve_thinking"

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer, strip_thinking_from_history=False)


RENDERERS: dict[str, Callable[[Tokenizer], BaseRenderer]] = {
    "nemotron3": Nemotron3Renderer,
    "nemotron3_disable_thinking": Nemotron3DisableThinkingRenderer,
    "nemotron3_low_thinking": Nemotron3LowThinkingRenderer,
    "nemotron3_preserve_thinking": Nemotron3PreserveThinkingRenderer,
    "nemotron3_ultra": Nemotron3UltraRenderer,
    "nemotron3_ultra_disable_thinking": Nemotron3UltraDisableThinkingRenderer,
    "nemotron3_ultra_medium_thinking": Nemotron3UltraMediumThinkingRenderer,
    "nemotron3_ultra_preserve_thinking": Nemotron3UltraPreserveThinkingRenderer,
}
"""This module's registry names (see :data:`tempering.renderers.RENDERERS`)."""
