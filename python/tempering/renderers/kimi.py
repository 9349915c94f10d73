"""Kimi K2 / K2.5 / K2.6: ``<|im_user|>user<|im_middle|>…<|im_end|>``, with a default system prompt.

Every message is ``<|im_{user,assistant,system}|>{role}<|im_middle|>{content}<|im_end|>`` with no
separator between messages; tool results are system-style turns named after the tool and
headed ``## Return of {tool_call_id}\\n``. Every assistant message opens with a think block,
empty (``<think></think>``) unless its reasoning is kept; tool calls follow the content as
``<|tool_calls_section_begin|><|tool_call_begin|>{id}<|tool_call_argument_begin|>{json}
<|tool_call_end|>…<|tool_calls_section_end|>``.

Two rules set Kimi apart, both from its Hugging Face chat template:

- a conversation that does not start with a system message (or a ``tool_declare`` message
  followed by one) gets the default system prompt ``You are Kimi, an AI assistant created by
  Moonshot AI.``, which is rendered and weighted like any system message;
- the turn being produced starts after the last assistant message that called no tool, not
  after the last user message: reasoning is kept from there on (and stripped before), and
  ``last_assistant_turn`` trains every assistant message from there on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from tempering.renderers._base import (
    BaseRenderer,
    MessageParts,
    ParseTermination,
    Piece,
    Rendering,
)
from tempering.renderers._base import (
    message_weights as base_message_weights,
)
from tempering.renderers._kimi_format import (
    BLOCK_MARKERS,
    CALL_ARGS,
    CALL_CLOSE,
    CALL_OPEN,
    CALL_RE,
    DEFAULT_SYSTEM,
    DEFAULT_SYSTEM_PROMPT,
    SECTION_CLOSE,
    SECTION_OPEN,
    SECTION_RE,
    THINK_RE,
    UNPARSED_MAX_CHARS,
    Turn,
    default_system_at,
    first_turn_index,
    read_turn,
    with_default_system,
)
from tempering.renderers._text import assistant_message
from tempering.renderers.kimi_tools import encode_tools_typescript
from tempering.renderers.llama3 import parse_at_stop_token
from tempering_protocols import Message, StopCondition, Tokenizer, ToolCall, TrainOnWhat

__all__ = [
    "KimiK2Renderer",
    "KimiK25DisableThinkingRenderer",
    "KimiK25Renderer",
    "KimiK26DisableThinkingRenderer",
    "KimiK26PreserveThinkingRenderer",
    "KimiK26Renderer",
]

# ------------------------------------------------------------------------------ renderers


class KimiK2Renderer(BaseRenderer):
    """Kimi K2 (Thinking), as the Tinker Cookbook renders it; does not extend prefixes.

    A conversation without a leading system message gets Kimi's default one. Reasoning is kept
    in the assistant messages of the produced turn (after the last assistant message that
    called no tool) and replaced by an empty ``<think></think>`` before it; pass
    ``strip_thinking_from_history=False`` to keep it everywhere. The generation prompt ends
    with the assistant header (``<|im_assistant|>assistant<|im_middle|>``).

    Tool results (role ``tool``) need ``tool_call_id``; their header names the tool (``name``,
    else ``tool``). Tools are declared as compact sorted JSON in a ``tool_declare`` message
    (:meth:`create_conversation_prefix_with_tools`).

    Example::

        r = KimiK2Renderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.
        # <|im_end|><|im_user|>user<|im_middle|>2+2?<|im_end|><|im_assistant|>assistant<|im_middle|>
    """

    name = "kimi_k2"

    _multipart_content = False
    """Whether a non-assistant message may give several text parts (K2.5 renders each)."""

    def __init__(self, tokenizer: Tokenizer, *, strip_thinking_from_history: bool = True) -> None:
        super().__init__(tokenizer)
        self.strip_thinking_from_history = strip_thinking_from_history
        token = self.special_token
        self._im_end = token("<|im_end|>")
        self._middle = (token("<|im_middle|>"),)
        self._opens = {
            "user": (token("<|im_user|>"),),
            "assistant": (token("<|im_assistant|>"),),
            "system": (token("<|im_system|>"),),
        }
        self._think_open, self._think_close = token("<think>"), token("</think>")
        self._section = (token(SECTION_OPEN),), (token(SECTION_CLOSE),)
        self._call = (token(CALL_OPEN),), (token(CALL_ARGS),), (token(CALL_CLOSE),)

    @property
    def extends_prefix(self) -> bool:
        return False

    def get_stop_sequences(self) -> StopCondition:
        return [self._im_end]

    def _prefill(self) -> tuple[Piece, ...]:
        """What the generation prompt puts after the assistant header (K2: nothing)."""
        return ()

    # ------------------------------------------------------------------ rendering

    def _header(self, turn: Turn) -> tuple[Piece, ...]:
        if turn.role in ("user", "assistant"):
            return (self._opens[turn.role], turn.role, self._middle)
        if turn.role == "tool":
            return (self._opens["system"], turn.name, self._middle, f"## Return of {turn.tool_call_id}\n")
        return (self._opens["system"], turn.role, self._middle)

    def _assistant_body(self, turn: Turn, keep_thinking: bool) -> tuple[Piece, ...]:
        thinking = turn.thinking if keep_thinking else ""
        out: list[Piece] = [(self._think_open,), thinking, (self._think_close,), turn.text]
        if turn.calls:
            section_open, section_close = self._section
            call_open, call_args, call_close = self._call
            out.append(section_open)
            for k, call in enumerate(turn.calls):
                call_id = call.id or f"functions.{call.name}:{k}"
                out += [call_open, call_id, call_args, call.arguments, call_close]
            out.append(section_close)
        out.append((self._im_end,))
        return tuple(out)

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        turns = [read_turn(m, i, multipart=self._multipart_content) for i, m in enumerate(messages)]
        at = default_system_at(messages)
        if at is not None:
            turns.insert(at, DEFAULT_SYSTEM)
        full = with_default_system(messages)
        # A prompt's produced turn is counted over all of it; a supervised example's over all but
        # its last message (the target), as the reference does.
        start = self.turn_start_index(full if generation else full[:-1])
        parts: list[MessageParts] = []
        for i, turn in enumerate(turns):
            if turn.role == "assistant":
                keep = i >= start or not self.strip_thinking_from_history
                body = self._assistant_body(turn, keep)
            elif turn.parts is not None:
                body = (*turn.parts, (self._im_end,))
            else:
                body = (turn.text, (self._im_end,))
            parts.append(MessageParts(self._header(turn), body))
        gen: tuple[Piece, ...] = ()
        if generation:
            gen = (self._opens["assistant"], "assistant", self._middle, *self._prefill())
        return Rendering(prefix=(), messages=tuple(parts), generation_header=gen)

    def turn_start_index(self, messages: Sequence[Message]) -> int:
        """After the last assistant message that called no tool: Kimi's template keeps the
        reasoning of the whole assistant/tool exchange that follows it."""
        return first_turn_index(messages)

    def message_weights(self, messages: Sequence[Message], train_on_what: TrainOnWhat) -> list[float]:
        """Weights of the rendered messages, the default system message included when it is added
        (it is trained like any system message, e.g. with ``all_messages``)."""
        full = with_default_system(messages)
        if train_on_what == TrainOnWhat.CUSTOMIZED and len(full) > len(messages):
            raise ValueError(
                f"train_on_what=customized: the {self.name} renderer adds Kimi's default system "
                "message to a conversation that has none, and that message has no 'trainable' flag; "
                "start the conversation with your own system message"
            )
        return base_message_weights(full, train_on_what, turn_start=self.turn_start_index(full[:-1]))

    # ------------------------------------------------------------------ tools

    def _declare_tools(self, tools: Sequence[Mapping[str, object]]) -> str:
        payload = [{"type": "function", "function": dict(tool)} for tool in tools]
        return json.dumps(payload, separators=(",", ":"), sort_keys=True)

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[Mapping[str, object]], system_prompt: str = ""
    ) -> list[Message]:
        """A ``tool_declare`` message (if there are tools), then the system message (the default
        one if ``system_prompt`` is empty), in the order Kimi's template puts them.

        Example::

            prefix = r.create_conversation_prefix_with_tools([weather_spec], "You are terse.")
            [m["role"] for m in prefix]  # ["tool_declare", "system"]
        """
        out: list[Message] = []
        if tools:
            out.append(Message(role="tool_declare", content=self._declare_tools(tools)))
        out.append(Message(role="system", content=system_prompt or DEFAULT_SYSTEM_PROMPT))
        return out

    # ------------------------------------------------------------------ parsing

    def _restore_prefill(self, tokens: list[int]) -> list[int]:
        """Sampled tokens as if the generation prompt's prefill were part of them (K2: as is)."""
        return tokens

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """Cut at ``<|im_end|>``, then split off tool calls, think blocks and text.

        Without ``<|im_end|>`` the response is truncated: its raw text is returned, MALFORMED.
        More than one ``<|im_end|>`` is a sampling error (wrong stop sequence): ``ValueError``.
        A tool call whose arguments are not JSON, or a block left open, is reported in
        ``unparsed_tool_calls``.

        Example::

            r.parse(tokenizer.encode("<think>2+2=4</think>4<|im_end|>"))
            # ({"role": "assistant", "content": "4", "thinking": "2+2=4"}, STOP_SEQUENCE)
        """
        ids = self._restore_prefill(list(tokens))
        content, termination = parse_at_stop_token(self, ids, self._im_end, "<|im_end|>")
        if not termination.is_clean:
            return Message(role="assistant", content=content), termination
        text, calls, unparsed = _split_tool_section(content)
        dangling = _dangling_block(content)
        if dangling is not None:
            unparsed.append(dangling)
        message = assistant_message(
            THINK_RE.sub("", text) if "<think>" in text else text,
            thinking="".join(THINK_RE.findall(text)) if "<think>" in text else "",
            tool_calls=calls,
            unparsed=unparsed,
        )
        return message, ParseTermination.STOP_SEQUENCE


def _split_tool_section(content: str) -> tuple[str, list[ToolCall], list[dict[str, str]]]:
    """The text before the first tool-call section, the calls in it, and those that failed."""
    match = SECTION_RE.search(content)
    if match is None:
        return content, [], []
    section = match.group(1) if match.group(1) is not None else match.group(2)
    calls: list[ToolCall] = []
    unparsed: list[dict[str, str]] = []
    for found in CALL_RE.finditer(section):
        call_id, arguments = found.group(1).strip(), found.group(2).strip()
        name = call_id.split(":", 1)[0]
        name = name.split(".", 1)[1] if "." in name else name
        try:
            json.loads(arguments)
        except json.JSONDecodeError as exc:
            unparsed.append({"raw_text": found.group(0), "error": f"Invalid JSON: {exc}"})
            continue
        calls.append(ToolCall(name=name, arguments=arguments, id=call_id))
    return content[: match.start()], calls, unparsed


def _dangling_block(content: str) -> dict[str, str] | None:
    """A tool block opened more often than closed: the model meant a call and was cut off."""
    for open_marker, close_marker in BLOCK_MARKERS:
        opened = content.count(open_marker)
        if opened and opened > content.count(close_marker):
            return {
                "raw_text": content[content.rfind(open_marker) :][:UNPARSED_MAX_CHARS],
                "error": (
                    f"unterminated tool block: '{open_marker}' opened without a matching '{close_marker}'"
                ),
            }
    return None


class KimiK25Renderer(KimiK2Renderer):
    """Kimi K2.5 (and K2.6) with thinking: K2's format with a ``<think>`` prefill.

    The generation prompt ends with ``<|im_assistant|>assistant<|im_middle|><think>``, so the
    model starts reasoning; the parser puts the ``<think>`` back before splitting the reasoning
    off. Tools are declared in TypeScript style (:mod:`tempering.renderers.kimi_tools`).
    A non-assistant message may give its content as several text parts.

    Example::

        r = KimiK25Renderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # …<|im_user|>user<|im_middle|>2+2?<|im_end|><|im_assistant|>assistant<|im_middle|><think>
        r.parse(tokenizer.encode("2+2=4</think>4<|im_end|>"))[0]
        # {"role": "assistant", "content": "4", "thinking": "2+2=4"}
    """

    name = "kimi_k25"
    _multipart_content = True

    def _prefill(self) -> tuple[Piece, ...]:
        return ((self._think_open,),)

    def _restore_prefill(self, tokens: list[int]) -> list[int]:
        if tokens and tokens[0] != self._think_open and self._think_close in tokens:
            return [self._think_open, *tokens]
        return tokens

    def _declare_tools(self, tools: Sequence[Mapping[str, object]]) -> str:
        return encode_tools_typescript([{"type": "function", "function": dict(tool)} for tool in tools])


class KimiK25DisableThinkingRenderer(KimiK25Renderer):
    """Kimi K2.5 / K2.6 with thinking off: the generation prompt ends with ``<think></think>``.

    A trained turn that reasons is refused (its render would not start with the prompt).

    Example::

        r = KimiK25DisableThinkingRenderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # …<|im_assistant|>assistant<|im_middle|><think></think>
    """

    name = "kimi_k25_disable_thinking"
    disables_thinking = True

    def _prefill(self) -> tuple[Piece, ...]:
        return ((self._think_open,), (self._think_close,))


class KimiK26PreserveThinkingRenderer(KimiK25Renderer):
    """Kimi K2.6 with ``preserve_thinking=true``: every assistant message keeps its reasoning.

    Otherwise K2.6 is K2.5. Like the Tinker Cookbook it reports ``extends_prefix = False``
    (the default system message and the ``<think>`` prefill are the same in every prompt, so in
    practice each prompt does extend the previous conversation).

    Example::

        r = KimiK26PreserveThinkingRenderer(tokenizer)
        r.build_supervised_example(convo)  # history keeps <think>reasoning</think>
    """

    name = "kimi_k26_preserve_thinking"

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer, strip_thinking_from_history=False)


class KimiK26Renderer(KimiK25Renderer):
    """Kimi K2.6 with thinking: token for token the K2.5 format (its template differs from
    K2.5's only by the opt-in ``preserve_thinking`` flag, see ``kimi_k26_preserve_thinking``).

    Example::

        r = KimiK26Renderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])  # …<think>
    """

    name = "kimi_k26"


class KimiK26DisableThinkingRenderer(KimiK25DisableThinkingRenderer):
    """Kimi K2.6 with thinking off: token for token ``kimi_k25_disable_thinking``.

    Example::

        r = KimiK26DisableThinkingRenderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])  # …<think></think>
    """

    name = "kimi_k26_disable_thinking"


RENDERERS = {
    "kimi_k2": KimiK2Renderer,
    "kimi_k25": KimiK25Renderer,
    "kimi_k25_disable_thinking": KimiK25DisableThinkingRenderer,
    "kimi_k26": KimiK26Renderer,
    "kimi_k26_disable_thinking": KimiK26DisableThinkingRenderer,
    "kimi_k26_preserve_thinking": KimiK26PreserveThinkingRenderer,
}
"""This module's registry names (see :data:`tempering.renderers.RENDERERS`)."""
