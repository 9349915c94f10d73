"""Qwen3.5 / 3.6 and Qwen3.8: ChatML with ``<think>`` blocks and XML tool calls.

The chat format is Qwen3's (``<|im_start|>role\\n…<|im_end|>``, messages separated by a newline)
with four changes the Tinker Cookbook 0.6.1 follows and this module reproduces token for token:

* content is trimmed (the template's ``content|trim``), thinking is not;
* the generation prompt ends with an open ``<think>\\n`` (or a closed empty block when thinking is
  off), and an assistant turn that did not reason gets an empty ``<think>\\n\\n</think>\\n\\n``
  block in its header (Qwen3.5: only after the last user message; Qwen3.8: every turn);
* tool calls are XML, ``<tool_call>\\n<function=name>\\n<parameter=key>\\nvalue\\n</parameter>\\n
  </function>\\n</tool_call>``, and a run of consecutive tool results shares one user block;
* Qwen3.8 puts a reasoning-effort sentence at the head of the system message (adding one when
  the conversation has none) and drops an empty system message.

The models are vision-language models; these renderers are text only and refuse image parts.
Special tokens (``<|im_start|>``, ``<|im_end|>``) are given as ids, so content that spells them is
tokenized as text (the cookbook's VL path would read them as control tokens). ``<think>``,
``</think>``, ``<tool_call>`` and the ``<tool_response>`` tags are added, non-special tokens in
the published tokenizers and stay inside text pieces.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

import attrs

from tempering.renderers._base import BaseRenderer, MessageParts, ParseTermination, Piece, Rendering
from tempering.renderers._conversation import last_user_index, message_weights
from tempering.renderers._qwen3_5_messages import (
    EMPTY_THINK,
    OPEN_THINK,
    REASONING_EFFORTS,
    TOOLS_PREAMBLE,
    CallFields,
    Msg,
    Part,
    load_messages,
    parse_body,
    trim_parts,
)
from tempering.renderers.chatml import ImChatRenderer
from tempering.renderers.llama3 import parse_at_stop_token
from tempering_protocols import Message, Tokenizer, TrainOnWhat

__all__ = [
    "REASONING_EFFORTS",
    "RENDERERS",
    "Qwen35DisableThinkingRenderer",
    "Qwen35Renderer",
    "Qwen38DisableThinkingRenderer",
    "Qwen38Renderer",
]

# ------------------------------------------------------------------------------ renderers


class Qwen35Renderer(ImChatRenderer):
    """Qwen3.5 (and 3.6) with thinking, as the Tinker Cookbook renders it; does not extend prefixes.

    The generation prompt ends with ``<think>\\n``. Thinking is kept only in the last message
    (``strip_thinking_from_history=False`` keeps it everywhere); an assistant message after the
    last user message that did not reason gets an empty think block in its header. Even with
    thinking kept, a sampled turn that did not reason (``…<think>\\n`` + ``\\n</think>…``) is not
    the token prefix of its re-rendering (the ``\\n\\n`` merges), so prefixes never extend.

    Tool results (role ``tool``) are ``<tool_response>`` blocks inside a user message; consecutive
    results share one. Tool declarations are the Qwen3.5 system preamble
    (:meth:`create_conversation_prefix_with_tools`).

    Example::

        r = Qwen35Renderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": " 2+2? "}])
        # <|im_start|>user\\n2+2?<|im_end|>\\n<|im_start|>assistant\\n<think>\\n
        r.build_supervised_example(
            [{"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": "4", "tool_calls": [{"name": "add", "arguments": '{"a": 2}'}]}])
        # …4\\n\\n<tool_call>\\n<function=add>\\n<parameter=a>\\n2\\n</parameter>\\n
        # </function>\\n</tool_call><|im_end|>
    """

    name = "qwen3_5"

    def __init__(self, tokenizer: Tokenizer, *, strip_thinking_from_history: bool = True) -> None:
        super().__init__(tokenizer)
        self.strip_thinking_from_history = strip_thinking_from_history
        self._think_close_id = self.special_token("</think>")
        for token in ("<think>", "<tool_call>", "</tool_call>"):
            self.special_token(token)

    @property
    def extends_prefix(self) -> bool:
        return False

    @property
    def generation_tail(self) -> str:
        """What the generation prompt writes after ``<|im_start|>assistant\\n``: an open think
        block, or a closed empty one when thinking is off."""
        return EMPTY_THINK if self.disables_thinking else OPEN_THINK

    # ----------------------------------------------------------- what the versions change

    def _prepare(self, messages: Sequence[Message]) -> list[Msg]:
        """The conversation as the template sees it (Qwen3.8 rewrites the system message)."""
        return load_messages(messages)

    def _strips_thinking(self, messages: Sequence[Msg], index: int, last_user: int) -> bool:
        """Qwen3.5 keeps thinking in the last message only, even an earlier turn after the last
        user message (a tool-calling turn): the cookbook keeps that over-stripping for the
        checkpoints trained on it, though the template would keep the thinking."""
        return (
            self.strip_thinking_from_history
            and messages[index].role == "assistant"
            and index != len(messages) - 1
        )

    def _header_think_block(self, message: Msg, index: int, last_user: int) -> str:
        """The empty think block an assistant header gets: after the last user message, when the
        turn did not reason (a thinking part, or an inline ``<think>`` in plain string content)."""
        if index <= last_user:
            return ""
        reasoned = any(kind == "thinking" for kind, _ in message.parts) or (
            message.plain and "<think>" in message.parts[-1][1]
        )
        return "" if reasoned else EMPTY_THINK

    def _argument_text(self, value: object) -> str:
        """Qwen3.5's template writes mappings and lists as JSON, scalars as Python's ``str``
        (``True``, ``None``)."""
        if isinstance(value, (dict, list)):
            return json.dumps(value)
        return str(value)

    # ----------------------------------------------------------- rendering

    def _tool_calls_text(self, parts: Sequence[Part], calls: Sequence[CallFields]) -> str:
        blocks: list[str] = []
        for call in calls:
            lines = [f"<tool_call>\n<function={call.name}>"]
            lines += [
                f"<parameter={key}>\n{self._argument_text(value)}\n</parameter>"
                for key, value in call.arguments.items()
            ]
            lines.append("</function>\n</tool_call>")
            blocks.append("\n".join(lines))
        visible = any(kind == "text" and text.strip() for kind, text in parts)
        return ("\n\n" if visible else "") + "\n".join(blocks)

    def _message(self, messages: Sequence[Msg], index: int, last_user: int) -> MessageParts:
        message = messages[index]
        is_last = index == len(messages) - 1
        prev_tool = index > 0 and messages[index - 1].role == "tool"
        next_tool = not is_last and messages[index + 1].role == "tool"
        is_tool = message.role == "tool"
        newline: tuple[Piece, ...] = (self.constant("\n"),) if index > 0 else ()

        parts = trim_parts(message.parts)
        shown = parts
        if self._strips_thinking(messages, index, last_user):
            shown = tuple(p for p in parts if p[0] != "thinking")
        body = "".join(
            f"<think>\n{text}\n</think>\n\n" if kind == "thinking" else text for kind, text in shown
        )
        if is_tool:
            body = f"<tool_response>\n{body}\n</tool_response>"
        if message.calls is not None:
            body += self._tool_calls_text(parts, message.calls)
        end: tuple[Piece, ...] = () if is_tool and next_tool else ((self._im_end_id,),)

        lead: tuple[Piece, ...] = ()
        if is_tool and prev_tool:
            header: tuple[Piece, ...] = (self.constant("\n"),)  # the shared user block stays open
        else:
            role = "user" if is_tool else message.role
            block = self._header_think_block(message, index, last_user) if message.role == "assistant" else ""
            if message.role == "assistant" and is_last and block.startswith(self.generation_tail):
                # The turn being produced: the generation prompt's own tail is header, the rest of
                # the block is what the model wrote after it.
                rest = block[len(self.generation_tail) :]
                block = self.generation_tail
                lead = (rest,) if rest else ()
            header = (*newline, self._im_start, f"{role}\n{block}")
        return MessageParts(header, (*lead, body, *end))

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        loaded = self._prepare(messages)
        last_user = max((i for i, m in enumerate(loaded) if m.role == "user"), default=-1)
        parts = tuple(self._message(loaded, i, last_user) for i in range(len(loaded)))
        gen: tuple[Piece, ...] = ()
        if generation:
            newline: tuple[Piece, ...] = (self.constant("\n"),) if loaded else ()
            gen = (*newline, self._im_start, f"assistant\n{self.generation_tail}")
        return Rendering(prefix=(), messages=parts, generation_header=gen)

    def message_weights(self, messages: Sequence[Message], train_on_what: TrainOnWhat) -> list[float]:
        """Weights of the messages as rendered (Qwen3.8 may add or drop a system message)."""
        message_weights(messages, train_on_what)  # checks the trainable flags, naming the caller's index
        rendered = [m.source for m in self._prepare(messages)]
        turn_start = last_user_index(rendered[:-1]) + 1
        return message_weights(rendered, train_on_what, turn_start=turn_start)

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[Mapping[str, object]], system_prompt: str = ""
    ) -> list[Message]:
        """A system message declaring ``tools`` (one JSON object per line) and how to call them
        in XML, followed by ``system_prompt``.

        Example::

            prefix = r.create_conversation_prefix_with_tools(tools, "You are terse.")
            # [{"role": "system",
            #   "content": "# Tools\\n\\nYou have access to …</IMPORTANT>\\n\\nYou are terse."}]
        """
        content = system_prompt
        if tools:
            declared = TOOLS_PREAMBLE.format(tools="\n".join(json.dumps(dict(tool)) for tool in tools))
            content = f"{declared}\n\n{system_prompt}" if system_prompt else declared
        return [Message(role="system", content=content)]

    # ----------------------------------------------------------- parsing

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """Cut at ``<|im_end|>``, put back the prompt's ``<think>\\n``, split thinking and tool calls.

        A response without ``<|im_end|>`` is MALFORMED and comes back as its text, unparsed. Two
        ``<|im_end|>`` are a ``ValueError`` (sampling did not stop on the stop token).

        Example::

            message, termination = r.parse(tokenizer.encode("2 and 2\\n</think>\\n\\n4<|im_end|>"))
            # ({"role": "assistant", "content": "4", "thinking": "2 and 2"}, STOP_SEQUENCE)
        """
        response = list(tokens)
        opening = list(self.constant(OPEN_THINK))
        if response[: len(opening)] != opening and self._think_close_id in response:
            response = opening + response
        text, termination = parse_at_stop_token(self, response, self._im_end_id, "<|im_end|>")
        if not termination.is_clean:
            return Message(role="assistant", content=text), termination
        return parse_body(text), termination


class Qwen35DisableThinkingRenderer(Qwen35Renderer):
    """Qwen3.5 with thinking off (``enable_thinking=False``): the prompt closes an empty think block.

    A trained turn that reasons is refused (the prompt told the model not to).

    Example::

        r = Qwen35DisableThinkingRenderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # …<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n
    """

    name = "qwen3_5_disable_thinking"
    disables_thinking = True


class Qwen38Renderer(Qwen35Renderer):
    """Qwen3.8 with thinking and a reasoning effort (``xhigh``, ``medium`` or ``low``).

    Differences from Qwen3.5: thinking is kept in every turn and every assistant turn that did
    not reason (a thinking part; an inline ``<think>`` in the text does not count) gets the empty
    block, wherever it is; the effort's sentence heads the system message (a system message is
    added when there is none; ``medium`` adds nothing) and an empty system message is dropped;
    scalar tool arguments are written as JSON (``true``, ``null``). It still does not extend
    prefixes (a turn that did not reason re-tokenizes, as in Qwen3.5).

    Example::

        r = Qwen38Renderer(tokenizer, reasoning_effort="low")
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # <|im_start|>system\\nReasoning effort is set to low. …<|im_end|>\\n<|im_start|>user\\n…
    """

    name = "qwen3_8_xhigh_reasoning"

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        reasoning_effort: str = "xhigh",
        strip_thinking_from_history: bool = False,
    ) -> None:
        if reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(
                f"unknown reasoning effort {reasoning_effort!r}; Qwen3.8 has {', '.join(REASONING_EFFORTS)}"
            )
        super().__init__(tokenizer, strip_thinking_from_history=strip_thinking_from_history)
        self.reasoning_effort = reasoning_effort

    @property
    def instructions(self) -> str:
        """The sentence put before the system prompt (none when thinking is off)."""
        return "" if self.disables_thinking else REASONING_EFFORTS[self.reasoning_effort]

    def _prepare(self, messages: Sequence[Message]) -> list[Msg]:
        loaded = load_messages(messages)
        head = self.instructions
        if loaded and loaded[0].role == "system":
            first, rest = loaded[0], loaded[1:]
            if any(kind != "text" for kind, _ in first.parts):
                # Thinking in a system message: the sentence goes before it, nothing is trimmed.
                if not head or (first.parts[0][0] == "text" and first.parts[0][1].startswith(head)):
                    return loaded
                return [attrs.evolve(first, parts=(("text", f"{head}\n\n"), *first.parts)), *rest]
            text = "".join(t for _, t in first.parts).strip()
            if not text and not head:
                return rest
            if head and not (text == head or text.startswith(f"{head}\n\n")):
                text = f"{head}\n\n{text}" if text else head
            return [attrs.evolve(first, parts=(("text", text),), plain=True), *rest]
        if not head:
            return loaded
        source = Message(role="system", content=head)
        if any("trainable" in m for m in messages):
            source["trainable"] = False
        return [Msg("system", (("text", head),), True, None, source, None), *loaded]

    def _strips_thinking(self, messages: Sequence[Msg], index: int, last_user: int) -> bool:
        return self.strip_thinking_from_history and messages[index].role == "assistant" and index <= last_user

    def _plan(self, messages: Sequence[Message], mode: TrainOnWhat):
        """Find the trained turn's generation prompt in the conversation as rendered.

        The cookbook looks for it after rewriting the system message, so in a conversation with
        no user message the turn starts at the added system message (nothing is zeroed), or, once
        an empty system message is dropped, at the first assistant message.
        """
        plan = super()._plan(messages, mode)
        if mode not in (TrainOnWhat.LAST_ASSISTANT_MESSAGE, TrainOnWhat.LAST_ASSISTANT_TURN):
            return plan
        loaded = self._prepare(messages)
        if mode == TrainOnWhat.LAST_ASSISTANT_MESSAGE:
            boundary = len(loaded) - 1
        else:
            boundary = max((i for i, m in enumerate(loaded) if m.role == "user"), default=-1) + 1
        start = loaded[boundary].index if 0 <= boundary < len(loaded) else None
        if start is None or loaded[boundary].role != "assistant":
            return attrs.evolve(plan, prompt=[], check_prompt=False)
        return attrs.evolve(plan, prompt=self._prompt_pieces(messages[:start]), check_prompt=True)

    def _header_think_block(self, message: Msg, index: int, last_user: int) -> str:
        if self.strip_thinking_from_history and index <= last_user:
            return ""
        return "" if any(kind == "thinking" for kind, _ in message.parts) else EMPTY_THINK

    def _argument_text(self, value: object) -> str:
        return value if isinstance(value, str) else json.dumps(value)


class Qwen38DisableThinkingRenderer(Qwen38Renderer):
    """Qwen3.8 with thinking off: no effort sentence, the prompt closes an empty think block.

    Example::

        r = Qwen38DisableThinkingRenderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # <|im_start|>user\\n2+2?<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n
    """

    name = "qwen3_8_disable_thinking"
    disables_thinking = True


def _named(name: str, make: Callable[[Tokenizer], Qwen35Renderer]) -> Callable[[Tokenizer], BaseRenderer]:
    def build(tokenizer: Tokenizer) -> BaseRenderer:
        renderer = make(tokenizer)
        renderer.name = name
        return renderer

    return build


RENDERERS: dict[str, Callable[[Tokenizer], BaseRenderer]] = {
    "qwen3_5": Qwen35Renderer,
    "qwen3_5_disable_thinking": Qwen35DisableThinkingRenderer,
    "qwen3_5_preserve_thinking": _named(
        "qwen3_5_preserve_thinking", lambda t: Qwen35Renderer(t, strip_thinking_from_history=False)
    ),
    "qwen3_8_xhigh_reasoning": Qwen38Renderer,
    "qwen3_8_medium_reasoning": _named(
        "qwen3_8_medium_reasoning", lambda t: Qwen38Renderer(t, reasoning_effort="medium")
    ),
    "qwen3_8_low_reasoning": _named(
        "qwen3_8_low_reasoning", lambda t: Qwen38Renderer(t, reasoning_effort="low")
    ),
    "qwen3_8_disable_thinking": Qwen38DisableThinkingRenderer,
}
"""This module's registry names (see :data:`tempering.renderers.RENDERERS`)."""
