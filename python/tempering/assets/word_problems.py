"""Arithmetic word problems in GSM8K's format, for ``tempering recipe math-rl`` on the tiny model.

Each row is ``{"question": ..., "answer": ...}`` like ``openai/gsm8k``: the answer is a worked
solution with a calculator annotation and a final ``#### n`` line::

    {"question": "Mia has 7 pens and gets 5 more. How many now?",
     "answer": "7 + 5 = <<7+5=12>>12\\n#### 12"}

One step each (add, take away, groups of, share equally), small numbers, so that a tiny model
can learn them in minutes. ``word_problems.jsonl`` (train) and ``word_problems_test.jsonl``
(held out) share no question. Written by :mod:`tempering.assets.generate`.
"""

from __future__ import annotations

import random

__all__ = ["word_problem", "word_problems"]

_NAMES = ("Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Max", "Eli", "Amy", "Ben", "Kai")
_ITEMS = ("apples", "pens", "cards", "books", "eggs", "coins", "shells", "stamps", "beads", "cups")


def _row(question: str, a: int, op: str, b: int, result: int) -> dict[str, object]:
    return {"question": question, "answer": f"{a} {op} {b} = <<{a}{op}{b}={result}>>{result}\n#### {result}"}


def word_problem(rng: random.Random) -> dict[str, object]:
    """One problem, drawn from ``rng``: a question and its GSM8K-style worked answer."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        return _row(f"{name} has {a} {item} and gets {b} more. How many now?", a, "+", b, a + b)
    if kind == 1:
        a = rng.randint(5, 30)
        b = rng.randint(1, a - 1)
        return _row(f"{name} has {a} {item} and gives away {b}. How many are left?", a, "-", b, a - b)
    if kind == 2:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        return _row(f"{name} has {a} bags of {b} {item}. How many {item} in all?", a, "*", b, a * b)
    b, share = rng.randint(2, 9), rng.randint(2, 9)
    return _row(
        f"{name} shares {b * share} {item} among {b} friends. How many each?", b * share, "/", b, share
    )


def word_problems(
    seed: int, train: int, test: int
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """``(train, test)`` rows drawn from ``seed``, no question in both (nor twice in one)."""
    rng = random.Random(seed)
    seen: set[object] = set()
    rows: list[dict[str, object]] = []
    while len(rows) < train + test:
        row = word_problem(rng)
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(row)
    return rows[:train], rows[train:]
