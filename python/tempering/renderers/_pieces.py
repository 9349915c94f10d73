"""Pieces built left to right, as a reference ``encode`` call sees its string (DeepSeek, gpt-oss,
Nemotron)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Self

from tempering.renderers._base import Piece

__all__ = ["MarkupRun", "PieceRun"]


class PieceRun:
    """Pieces built left to right: text accumulates into one piece until a token id interrupts it,
    so text the reference encodes in one call is tokenized as one string here too.

    Example::

        PieceRun().token(start).text("user").text("\\n").token(end).pieces()
        # ((start,), "user\\n", (end,))
    """

    def __init__(self) -> None:
        self._pieces: list[Piece] = []
        self._text = ""

    def text(self, text: str) -> Self:
        self._text += text
        return self

    def token(self, *ids: int) -> Self:
        if self._text:
            self._pieces.append(self._text)
            self._text = ""
        if ids:
            self._pieces.append(ids)
        return self

    def pieces(self) -> tuple[Piece, ...]:
        self.token()
        return tuple(self._pieces)


class MarkupRun(PieceRun):
    """A :class:`PieceRun` that also takes markup: text the format writes, split at its control
    tokens (which become ids); text given to :meth:`text` is never split."""

    def __init__(self, split: Callable[[str], list[Piece]]) -> None:
        super().__init__()
        self._split = split

    def markup(self, markup: str) -> Self:
        """Text the format writes: its control tokens become ids."""
        for piece in self._split(markup):
            if isinstance(piece, str):
                self.text(piece)
            else:
                self.token(*piece)
        return self
