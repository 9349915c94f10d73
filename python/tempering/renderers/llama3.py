"""Llama 3: ``<|begin_of_text|>`` then ``<|start_header_id|>role<|end_header_id|>\\n\\n…<|eot_id|>``,
token-identical to the Tinker Cookbook's ``llama3``."""

from __future__ import annotations

from collections.abc import Sequence

from tempering.renderers._base import BaseRenderer, MessageParts, ParseTermination, Piece, Rendering
from tempering.renderers._text import assistant_message
from tempering.renderers.role_colon import plain_text_content
from tempering_protocols import Message, StopCondition, Tokenizer

__all__ = ["Llama3Renderer", "parse_at_stop_token"]


def parse_at_stop_token(
    renderer: BaseRenderer, tokens: Sequence[int], stop: int, stop_name: str | None = None
) -> tuple[str, ParseTermination]:
    """The text before the single ``stop`` token, and how the response ended.

    No stop token: the whole text, ``MALFORMED`` (the sampler ran out of tokens). More than one:
    a ``ValueError`` (naming the token as ``stop_name`` when given), since a sampler that stops
    at ``stop`` cannot return two (the wrong stop sequences were given to it).
    """
    tokens = list(tokens)
    count = tokens.count(stop)
    if count == 0:
        return renderer.decode(tokens), ParseTermination.MALFORMED
    if count > 1 and stop_name is not None:
        raise ValueError(
            f"the response has {count} {stop_name} tokens; sampling should stop at the first "
            "(use the renderer's get_stop_sequences())"
        )
    if count > 1:
        raise ValueError(
            f"the response holds the stop token {count} times, where sampling stops at the first: "
            f"were the {renderer.name} renderer's stop sequences given to the sampler?"
        )
    return renderer.decode(tokens[: tokens.index(stop)]), ParseTermination.STOP_SEQUENCE


class Llama3Renderer(BaseRenderer):
    """Llama 3 / 3.1 headers; extends prefixes.

    Like the Tinker Cookbook (and unlike the Hugging Face template) it adds no "Cutting Knowledge
    Date" system preamble, does not trim content, and writes each role as given (a ``tool`` result
    gets a ``tool`` header, not ``ipython``). The format carries no thinking (a message with
    thinking is an error) and no tool calls (Llama 3's bare-JSON calls cannot be told apart from
    JSON content): an assistant message's ``tool_calls`` are not written, its text is, as in the
    Cookbook; a parsed response is its text.

    Example::

        r = Llama3Renderer(tokenizer)
        r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
        # <|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\n2+2?<|eot_id|>
        # <|start_header_id|>assistant<|end_header_id|>\\n\\n
    """

    name = "llama3"

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self._bos = (self.special_token("<|begin_of_text|>"),)
        self._start_header = (self.special_token("<|start_header_id|>"),)
        self._end_header = (self.special_token("<|end_header_id|>"),)
        self._eot_id = self.special_token("<|eot_id|>")

    @property
    def extends_prefix(self) -> bool:
        return True

    def get_stop_sequences(self) -> StopCondition:
        return [self._eot_id]

    def _header(self, role: str) -> tuple[Piece, ...]:
        return (self._start_header, self.constant(role), self._end_header, self.constant("\n\n"))

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        parts = tuple(
            MessageParts(self._header(m["role"]), (plain_text_content(m, i, self.name), (self._eot_id,)))
            for i, m in enumerate(messages)
        )
        gen = self._header("assistant") if generation else ()
        return Rendering(prefix=(self._bos,), messages=parts, generation_header=gen)

    def parse(self, tokens: Sequence[int], /) -> tuple[Message, ParseTermination]:
        """Cut at ``<|eot_id|>``; the text before it is the content.

        Example::

            r.parse(tokenizer.encode("4<|eot_id|>"))
            # ({"role": "assistant", "content": "4"}, ParseTermination.STOP_SEQUENCE)
        """
        text, termination = parse_at_stop_token(self, tokens, self._eot_id)
        return assistant_message(text), termination


RENDERERS = {"llama3": Llama3Renderer}
"""This module's registry names (see :data:`tempering.renderers.RENDERERS`)."""
