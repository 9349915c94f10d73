"""One benchmark item, and reading a text field of a row with an error that names it."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from tempering.data import RowError

__all__ = ["BenchmarkItem", "text_field"]


@attrs.frozen
class BenchmarkItem:
    """One problem: its id (the row's ``id`` field, else its index), the problem text, the
    reference answer (a final answer, a letter, or what the grader checks) and what else its
    grader needs (``meta``: multiple-choice letters, IFEval instructions, code tests)."""

    id: str
    prompt: str
    answer: str
    meta: Mapping[str, object] = attrs.field(factory=dict[str, object], eq=False)


def text_field(row: Mapping[str, object], field: str, name: str) -> str:
    """``row[field]`` as non-empty text (a number is written out); :class:`RowError` otherwise."""
    if field not in row:
        raise RowError(f"{name}: missing field {field!r} (the row has {sorted(row)})")
    value = row[field]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"{name}: field {field!r} must be non-empty text, got {value!r}")
    return value
