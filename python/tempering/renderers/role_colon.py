"""A plain-text format for base models: ``User: …\\n\\nAssistant: …\\n\\n``, token-identical to the
Tinker Cookbook's ``role_colon``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from tempering.renderers._base import BaseRenderer, MessageParts, ParseTermination, Piece, Rendering
from tempering.renderers._text import assistant_message
from tempering_protocols import Message, StopCondition, Tokenizer

__all__ = ["RoleColonRenderer", "plain_text_content"]

STOP = "\n\nUser:"
_CONTENT_PREFIX, _CONTENT_SUFFIX = " ", "\n\n"
_NOT_ASSISTANT_OVERLAP = "<UNUSED>"
"""What the reference appends after a conversation's last message when it is not an assistant's
(its stop overlap placeholder, which it does render): kept for token parity."""


def plain_text_content(message: Message, index: int, fmt: str) -> str:
    """The text of a message whose format has neither thinking nor structured content.

    Accepts a ``str`` or a list of exactly one text part (what the Tinker Cookbook's
    ``ensure_text`` accepts); anything else, and tempering's ``thinking`` field, is a
    ``ValueError`` naming the message.
    """
    role = message["role"]
    if message.get("thinking"):
        raise ValueError(f"message {index} ({role}) has thinking, which the {fmt} format cannot render")
    content = cast("object", message["content"])
    if isinstance(content, str):
        return content
    parts = cast("list[Mapping[str, object]]", content)
    if len(parts) == 1 and parts[0].get("type") == "text":
        return cast("str", parts[0]["text"])
    kinds = ", ".join(str(p.get("type")) for p in parts) or "none"
    raise ValueError(
        f"message {index} ({role}) has content parts [{kinds}]; the {fmt} format renders plain text "
        "only (a str, or exactly one text part; no thinking)"
    )


class RoleColonRenderer(BaseRenderer):
    """``Role: content`` blocks separated by a blank line; needs no special token; extends prefixes.

    The header of a message is ``"User:"`` (the role, capitalized); the completion is a space, the
    content and ``"\\n\\n"``, tokenized together. The tokenizer's BOS token (if it has one) starts
    the conversation. Sampling stops at the string ``"\\n\\nUser:"``; in a supervised example the
    ``"User:"`` part of it ends the last assistant message, so the model learns to write it.
    No thinking: a message with thinking is an error. The format has no tool-call syntax: an
    assistant message's ``tool_calls`` are not written (its text is), and a ``tool`` result is a
    ``Tool:`` block, as in the Tinker Cookbook; declaring tools is refused.

    Example::

        r = RoleColonRenderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])  # "User: 2+2?\\n\\nAssistant:"
        r.get_stop_sequences()  # ["\\n\\nUser:"]
    """

    name = "role_colon"

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        bos = cast("object", getattr(tokenizer, "bos_token", None))
        self._bos: tuple[int, ...] = (
            tuple(tokenizer.encode(bos, add_special_tokens=False)) if isinstance(bos, str) else ()
        )
        eos = cast("object", getattr(tokenizer, "eos_token_id", None))
        self._eos_id: int | None = eos if isinstance(eos, int) else None

    @property
    def extends_prefix(self) -> bool:
        return True

    def get_stop_sequences(self) -> StopCondition:
        return [STOP]

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        parts: list[MessageParts] = []
        for i, m in enumerate(messages):
            text = plain_text_content(m, i, self.name)
            completion: tuple[Piece, ...] = (_CONTENT_PREFIX + text + _CONTENT_SUFFIX,)
            if not generation and i == len(messages) - 1:
                # The stop string's "User:" is what the model must write to end its turn.
                completion += ("User:" if m["role"] == "assistant" else _NOT_ASSISTANT_OVERLAP,)
            parts.append(MessageParts((self.constant(f"{m['role'].capitalize()}:"),), completion))
        gen = (self.constant("Assistant:"),) if generation else ()
        prefix: tuple[Piece, ...] = (self._bos,) if self._bos else ()
        return Rendering(prefix=prefix, messages=tuple(parts), generation_header=gen)

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """Cut at ``"\\n\\nUser:"``; drop the space after ``"Assistant:"`` and a trailing blank line.

        Ends with ``STOP_SEQUENCE`` for exactly one ``"\\n\\nUser:"``, ``EOS`` for the EOS token and
        no stop string (a base model ending a single-turn answer), ``MALFORMED`` otherwise
        (truncated, both, or several stop strings).

        Example::

            r.parse(tokenizer.encode(" 4\\n\\nUser:"))
            # ({"role": "assistant", "content": "4"}, ParseTermination.STOP_SEQUENCE)
        """
        tokens = list(tokens)
        eos = self._eos_id is not None and bool(tokens) and tokens[-1] == self._eos_id
        if eos:
            tokens = tokens[:-1]
        pieces = self.decode(tokens).split(STOP)
        message = assistant_message(pieces[0].removeprefix(_CONTENT_PREFIX).removesuffix(_CONTENT_SUFFIX))
        if len(pieces) == 1:
            return message, ParseTermination.EOS if eos else ParseTermination.MALFORMED
        if len(pieces) == 2 and not eos:
            return message, ParseTermination.STOP_SEQUENCE
        return message, ParseTermination.MALFORMED


RENDERERS = {"role_colon": RoleColonRenderer}
"""This module's registry names (see :data:`tempering.renderers.RENDERERS`)."""
