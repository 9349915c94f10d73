"""The shipped word problems: GSM8K's schema, right answers, no question shared by the splits."""

from __future__ import annotations

import re

from tempering.data.hub import load_math_problems

_OPS = {
    r"has (\d+) \w+ and gets (\d+) more": lambda a, b: a + b,
    r"has (\d+) \w+ and gives away (\d+)": lambda a, b: a - b,
    r"has (\d+) bags of (\d+) \w+": lambda a, b: a * b,
    r"shares (\d+) \w+ among (\d+) friends": lambda a, b: a // b,
}


def _solve(question: str) -> int:
    for pattern, op in _OPS.items():
        if m := re.search(pattern, question):
            return op(int(m[1]), int(m[2]))
    raise AssertionError(f"unexpected question {question!r}")


def test_word_problems_read_as_gsm8k_and_are_right() -> None:
    train = load_math_problems("gsm8k", source="tempering-assets:word_problems.jsonl", split="train")
    test = load_math_problems("gsm8k", source="tempering-assets:word_problems_test.jsonl")
    assert (len(train), len(test)) == (1000, 200)
    for problem in [*train, *test]:
        assert problem.answer == str(_solve(problem.question)), problem.origin
    assert not {p.question for p in train} & {p.question for p in test}
    assert len({p.question for p in train}) == len(train)
