"""ChatML and Qwen3: ``<|im_start|>role\\n…<|im_end|>``, messages separated by a newline.

The Qwen3 renderers (``qwen3``, ``qwen3_disable_thinking``, ``qwen3_instruct``) are
token-identical to the Tinker Cookbook's; ``chatml`` is tempering's own plain ChatML.

The newline between messages opens the next message's header, so an assistant completion ends
with ``<|im_end|>``, the stop token: what the sampler returns is exactly what was rendered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import ClassVar, Literal, TypeAlias, cast

from tempering.renderers._base import BaseRenderer, MessageParts, ParseTermination, Piece, Rendering
from tempering.renderers._conversation import last_user_index
from tempering.renderers._messages import json_tool_call, tool_call_fields
from tempering.renderers._text import (
    assistant_message,
    format_xml_tool_calls,
    parse_xml_body,
)
from tempering.renderers.llama3 import parse_at_stop_token
from tempering_protocols import Message, StopCondition, Tokenizer, ToolCall, UnparsedToolCall

__all__ = [
    "ChatMLRenderer",
    "ImChatRenderer",
    "Qwen3DisableThinkingRenderer",
    "Qwen3InstructRenderer",
    "Qwen3Renderer",
]


class ImChatRenderer(BaseRenderer):
    """What the ``<|im_start|>role\\n…<|im_end|>`` formats share (ChatML, Qwen3, Qwen3.5): the two
    tokens, ``<|im_end|>`` as the stop token, and a message header that a newline opens from the
    second message on. Subclasses render, parse and say whether they extend prefixes.

    Example::

        r = get_renderer("chatml", tokenizer)
        r.get_stop_sequences()  # [<|im_end|>]
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self._im_start = (self.special_token("<|im_start|>"),)
        self._im_end_id = self.special_token("<|im_end|>")

    def get_stop_sequences(self) -> StopCondition:
        return [self._im_end_id]

    def _header(self, index: int, role: str) -> tuple[Piece, ...]:
        """``<|im_start|>role\\n`` for message ``index`` (preceded by a newline after the first)."""
        newline: tuple[Piece, ...] = (self.constant("\n"),) if index > 0 else ()
        return (*newline, self._im_start, self.constant(f"{role}\n"))


class ChatMLRenderer(ImChatRenderer):
    """ChatML, as used by Qwen2.5 and many fine-tunes; extends prefixes.

    Thinking (``message["thinking"]``) is rendered as a ``<think>\\n…\\n</think>\\n\\n`` block before
    the content and kept in every turn; tool calls as ``<tool_call>`` JSON blocks after it.

    Example::

        r = ChatMLRenderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # <|im_start|>user\\n2+2?<|im_end|>\\n<|im_start|>assistant\\n
    """

    name = "chatml"

    @property
    def extends_prefix(self) -> bool:
        return True

    def _assistant_header_extra(self) -> tuple[Piece, ...]:
        return ()

    def _header_role(self, message: Message) -> str:
        return message["role"]

    def _show_thinking(self, messages: Sequence[Message], index: int) -> bool:
        return bool(_flat_content(messages[index], index)[1])

    def _body(self, messages: Sequence[Message], index: int) -> str:
        message = messages[index]
        body, thinking = _flat_content(message, index)
        if message["role"] == "assistant":
            if self._show_thinking(messages, index):
                body = f"<think>\n{thinking}\n</think>\n\n{body}"
            calls = [
                ToolCall(name=name, arguments=arguments)
                for name, arguments in (
                    tool_call_fields(c, f"message {index}")
                    for c in cast("list[object]", message.get("tool_calls") or [])
                )
            ]
            body = format_xml_tool_calls(body, calls)
        elif message.get("tool_calls"):
            raise ValueError(
                f"message {index} ({message['role']}) has tool_calls; only assistants call tools"
            )
        return body

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        parts: list[MessageParts] = []
        for i, message in enumerate(messages):
            header = self._header(i, self._header_role(message))
            if message["role"] == "assistant":
                header += self._assistant_header_extra()
            parts.append(MessageParts(header, (self._body(messages, i), (self._im_end_id,))))
        gen: tuple[Piece, ...] = ()
        if generation:
            gen = self._header(len(messages), "assistant") + self._assistant_header_extra()
        return Rendering(prefix=(), messages=tuple(parts), generation_header=gen)

    def parse_response(self, tokens: Sequence[int], /) -> tuple[Message, bool]:
        """Cut at ``<|im_end|>``; split off thinking and tool calls.

        Example::

            message, ok = r.parse_response(tokenizer.encode("4<|im_end|>"))
            # ({"role": "assistant", "content": "4"}, True)
        """
        tokens = list(tokens)
        stopped = self._im_end_id in tokens
        if stopped:
            tokens = tokens[: tokens.index(self._im_end_id)]
        message, ok = parse_xml_body(self.decode(tokens))
        return message, ok and stopped


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_TOOL_OPEN, _TOOL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<think>(.*?)</think>|<tool_call>(.*?)</tool_call>", re.DOTALL)
_RAW_TEXT_LIMIT = 16384

_Part: TypeAlias = "tuple[Literal['text', 'thinking'], str]"
"""A content part: ``("text", …)`` or ``("thinking", …)``."""

_QWEN3_TOOLS_PREAMBLE = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def _content_of(message: Message, index: int) -> str | list[_Part]:
    """The content as the cookbook sees it: a ``str``, or parts (tempering's ``thinking`` field is a
    thinking part before the text). A plain string stays a string: the template treats the two
    differently (an inline ``<think>`` in a string is normalized, a part is framed)."""
    content = cast("object", message["content"])
    thinking = cast("object", message.get("thinking"))
    if thinking is not None and not isinstance(thinking, str):
        raise TypeError(f"message {index} ({message['role']}) has thinking of type {type(thinking).__name__}")
    if isinstance(content, str) and not thinking:
        return content
    parts: list[_Part] = [("thinking", thinking)] if thinking else []
    if isinstance(content, str):
        parts.append(("text", content))
    else:
        for part in cast("list[Mapping[str, str]]", content):
            parts.append(
                ("thinking", part["thinking"]) if part["type"] == "thinking" else ("text", part["text"])
            )
    return parts


def _flat_content(message: Message, index: int) -> tuple[str, str]:
    """``(text, thinking)`` of a message in either format: parts of each kind joined in order."""
    content = _content_of(message, index)
    if isinstance(content, str):
        return content, ""
    return (
        "".join(v for k, v in content if k == "text"),
        "".join(v for k, v in content if k == "thinking"),
    )


def _tool_call_block(call: object, index: int) -> str:
    """``<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>``, the arguments re-serialized as
    ``json.dumps`` writes them (ASCII-escaped), as the cookbook does."""
    name, arguments = tool_call_fields(call, f"message {index}")
    try:
        value = cast("object", json.loads(arguments))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"message {index}: tool call {name!r} has arguments that are not JSON: {exc}"
        ) from None
    return f"{_TOOL_OPEN}\n{json.dumps({'name': name, 'arguments': value})}\n{_TOOL_CLOSE}"


def _frame_thinking(reasoning: str) -> str:
    """The block Qwen3's template writes around the produced turn's reasoning (even an empty one)."""
    return f"{_THINK_OPEN}\n{reasoning.strip(chr(10))}\n{_THINK_CLOSE}\n\n"


def _parse_tool_call(body: str, raw_text: str) -> ToolCall | UnparsedToolCall:
    """A tool call from the JSON between the tags, or an unparsed entry ``{"raw_text", "error"}``."""
    call = json_tool_call(body)
    return UnparsedToolCall(raw_text=raw_text, error=call) if isinstance(call, str) else call


class Qwen3Renderer(ImChatRenderer):
    """Qwen3 with thinking, as its chat template renders it (``enable_thinking=True``).

    ChatML (``<|im_start|>role\\n…<|im_end|>``, messages joined by a newline). The produced turn
    (the last message, when it is an assistant's and some user message exists) gets its reasoning
    framed as ``<think>\\n…\\n</think>\\n\\n``, and an empty block when it has none; earlier assistant
    turns lose their thinking (``strip_thinking_from_history``), so this renderer does **not**
    extend prefixes. Pass ``strip_thinking_from_history=False`` to keep (and frame) thinking in
    every assistant turn and extend prefixes. Tool calls are ``<tool_call>`` JSON blocks after the
    text; tool results are user turns wrapped in ``<tool_response>``.

    Example::

        r = Qwen3Renderer(tokenizer)
        r.extends_prefix  # False
        r.build_supervised_example(
            [{"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": "4", "thinking": "two plus two"}])
        # …<|im_start|>assistant\\n<think>\\ntwo plus two\\n</think>\\n\\n4<|im_end|>
    """

    name = "qwen3"
    frames_thinking: ClassVar[bool] = True
    """Whether the produced turn's reasoning is framed (Qwen3-Instruct-2507 writes no block)."""

    def __init__(self, tokenizer: Tokenizer, *, strip_thinking_from_history: bool = True) -> None:
        super().__init__(tokenizer)
        if self.frames_thinking:  # the framed block's tags are single tokens of the tokenizer
            self._think = (self.special_token(_THINK_OPEN),)
            self._think_end = (self.special_token(_THINK_CLOSE),)
        for token in (_TOOL_OPEN, _TOOL_CLOSE):
            self.special_token(token)  # one id each: a tokenizer of another model is refused
        self.strip_thinking_from_history = strip_thinking_from_history

    @property
    def extends_prefix(self) -> bool:
        return not self.strip_thinking_from_history

    def _check_message(self, messages: Sequence[Message], index: int, last_user: int) -> None:
        """Hook for variants that refuse some conversations."""

    def _body(self, message: Message, index: int, *, is_last: bool, last_user: int) -> str:
        role = message["role"]
        # The template frames only turns after the last user message; with history kept, every
        # assistant turn is framed alike (what prefix extension needs).
        frames = (
            self.frames_thinking
            and role == "assistant"
            and last_user >= 0
            and (is_last or not self.strip_thinking_from_history)
        )
        content = _content_of(message, index)
        if isinstance(content, str):
            reasoned = _THINK_OPEN in content
            if frames and _THINK_CLOSE in content:
                reasoning, _, rest = content.partition(_THINK_CLOSE)
                body = _frame_thinking(reasoning.rpartition(_THINK_OPEN)[2]) + rest.lstrip("\n")
            else:
                body = content
        else:
            reasoned = any(kind == "thinking" for kind, _ in content)
            if self.strip_thinking_from_history and role == "assistant" and not is_last:
                content = [p for p in content if p[0] != "thinking"]
            out: list[str] = []
            after_block = False
            for kind, value in content:
                if kind == "thinking":
                    out.append(_frame_thinking(value) if frames else f"{_THINK_OPEN}{value}{_THINK_CLOSE}")
                    after_block = frames
                else:
                    out.append(value.lstrip("\n") if after_block else value)
                    after_block = False
            body = "".join(out)
        has_text = bool(body)
        if frames and not reasoned:
            body = _frame_thinking("") + body.lstrip("\n")
        if role == "tool":
            body = f"<tool_response>\n{body}\n</tool_response>"
        calls = cast("object", message.get("tool_calls"))
        if calls is not None:
            if role != "assistant":
                raise ValueError(f"message {index} ({role}) has tool_calls; only assistants call tools")
            if not isinstance(calls, list):
                raise TypeError(f"message {index}: tool_calls is a {type(calls).__name__}, not a list")
            blocks = [_tool_call_block(c, index) for c in cast("list[object]", calls)]
            body += ("\n" if has_text else "") + "\n".join(blocks)
        return body

    def _generation_header(self, index: int) -> tuple[Piece, ...]:
        return self._header(index, "assistant")

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        last_user = last_user_index(messages)
        parts: list[MessageParts] = []
        for i, message in enumerate(messages):
            self._check_message(messages, i, last_user)
            role = "user" if message["role"] == "tool" else message["role"]
            body = self._body(message, i, is_last=i == len(messages) - 1, last_user=last_user)
            parts.append(MessageParts(self._header(i, role), (body, (self._im_end_id,))))
        gen = self._generation_header(len(messages)) if generation else ()
        return Rendering(prefix=(), messages=tuple(parts), generation_header=gen)

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """Cut at ``<|im_end|>``; split ``<think>`` blocks into thinking and ``<tool_call>`` blocks
        into tool calls (unparseable ones into ``unparsed_tool_calls``).

        A response with no ``<|im_end|>`` is ``MALFORMED`` and its text is left as is.

        Example::

            r.parse(tokenizer.encode("<think>\\nhmm\\n</think>\\n\\n4<|im_end|>"))
            # ({"role": "assistant", "content": "4", "thinking": "hmm"}, STOP_SEQUENCE)
        """
        text, termination = parse_at_stop_token(self, tokens, self._im_end_id)
        if termination != ParseTermination.STOP_SEQUENCE or (
            _THINK_OPEN not in text and _TOOL_OPEN not in text
        ):
            return assistant_message(text), termination
        parts: list[_Part] = []
        calls: list[ToolCall] = []
        unparsed: list[UnparsedToolCall] = []
        pos = 0
        for match in _BLOCK.finditer(text):
            if match.start() > pos:
                parts.append(("text", text[pos : match.start()]))
            thinking, call_body = match.group(1), match.group(2)
            if thinking is not None:
                if thinking:
                    parts.append(("thinking", thinking))
            else:
                call = _parse_tool_call(call_body, match.group(0))
                if "raw_text" in call:
                    unparsed.append(call)
                else:
                    calls.append(call)
            pos = match.end()
        if pos < len(text):
            parts.append(("text", text[pos:]))
        if self.frames_thinking:
            parts = _unframe(parts)
        opens = text.count(_TOOL_OPEN)
        if opens > text.count(_TOOL_CLOSE):
            unparsed.append(
                {
                    "raw_text": text[text.rfind(_TOOL_OPEN) :][:_RAW_TEXT_LIMIT],
                    "error": f"unterminated tool block: '{_TOOL_OPEN}' opened without a matching "
                    f"'{_TOOL_CLOSE}'",
                }
            )
        message = assistant_message(
            "".join(v for k, v in parts if k == "text"),
            thinking="".join(v for k, v in parts if k == "thinking"),
            tool_calls=calls,
            unparsed=unparsed,
        )
        return message, termination

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[Mapping[str, object]], system_prompt: str = ""
    ) -> list[Message]:
        """One system message: ``system_prompt``, a blank line, then Qwen3's ``# Tools`` section
        (each tool as ``{"type": "function", "function": …}`` JSON in ``<tools>``).

        Example::

            prefix = r.create_conversation_prefix_with_tools([weather_spec], "Be terse.")
            # [{"role": "system", "content": "Be terse.\\n\\n# Tools\\n\\nYou may call …"}]
        """
        text = ""
        if tools:
            lines = "\n".join(
                json.dumps({"type": "function", "function": dict(tool)}, separators=(", ", ": "))
                for tool in tools
            )
            text = _QWEN3_TOOLS_PREAMBLE.format(tools=lines)
        content = f"{system_prompt}\n\n{text}" if system_prompt else text
        return [Message(role="system", content=content)]


def _unframe(parts: list[_Part]) -> list[_Part]:
    """Undo :func:`_frame_thinking`: padding newlines are framing, an empty block is no reasoning."""
    out: list[_Part] = []
    after_block = False
    for kind, value in parts:
        if kind == "thinking":
            reasoning = value.strip("\n")
            if reasoning:
                out.append(("thinking", reasoning))
            after_block = True
        else:
            out.append(("text", value.lstrip("\n") if after_block else value))
            after_block = False
    return out


class Qwen3DisableThinkingRenderer(Qwen3Renderer):
    """Qwen3 with thinking switched off (``enable_thinking=False``); does not extend prefixes.

    The generation prompt ends with an empty ``<think>\\n\\n</think>\\n\\n`` block, and the produced
    turn is rendered with the same empty block, so training matches sampling; earlier assistant
    turns are rendered without one (as the template does), which is why prefixes do not extend.
    A trained turn that reasons is refused (its prompt told the model not to), and so is a
    produced turn in a conversation with no user message (the template writes no block there,
    but the prompt always opens one).

    Example::

        r = Qwen3DisableThinkingRenderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # …<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n
    """

    name = "qwen3_disable_thinking"
    disables_thinking = True

    def _check_message(self, messages: Sequence[Message], index: int, last_user: int) -> None:
        message = messages[index]
        if (
            message["role"] == "assistant"
            and index == len(messages) - 1
            and last_user < 0
            and _content_of(message, index)
        ):
            raise ValueError(
                f"message {index} (assistant): this conversation has no user message, so Qwen3's "
                "template writes no empty think block on the produced turn, but the generation "
                "prompt always opens one; add a user message or use the 'qwen3' renderer"
            )

    def _generation_header(self, index: int) -> tuple[Piece, ...]:
        return (
            *self._header(index, "assistant"),
            self._think,
            self.constant("\n\n"),
            self._think_end,
            self.constant("\n\n"),
        )


class Qwen3InstructRenderer(Qwen3Renderer):
    """Qwen3-Instruct-2507: ChatML with tool calls and no thinking block; extends prefixes.

    The 2507 instruct models do not use ``<think>``: no turn is framed. Thinking given anyway is
    rendered as ``<think>…</think>`` in the last message and dropped from earlier assistant turns.

    Example::

        r = Qwen3InstructRenderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # <|im_start|>user\\n2+2?<|im_end|>\\n<|im_start|>assistant\\n
    """

    name = "qwen3_instruct"
    frames_thinking = False

    @property
    def extends_prefix(self) -> bool:
        return True


RENDERERS = {
    "chatml": ChatMLRenderer,
    "qwen3": Qwen3Renderer,
    "qwen3_disable_thinking": Qwen3DisableThinkingRenderer,
    "qwen3_instruct": Qwen3InstructRenderer,
}
"""This module's registry names (see :data:`tempering.renderers.RENDERERS`)."""
