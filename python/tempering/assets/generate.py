"""Regenerate the shipped data sets, deterministically: ``python -m tempering.assets.generate [DIR]``.

Everything is derived by program from a fixed seed, so the answers are right and a tiny model
can learn them:

- ``arithmetic_chat.jsonl`` (400) and ``arithmetic_chat_test.jsonl`` (100, no question shared
  with the first): addition, subtraction and multiplication of small numbers, and short word
  tasks (reverse, capitalize, count letters, next number); some with a system prompt, some
  two turns long.
- ``arithmetic_preferences.jsonl`` (300): a question, a short correct answer, and either a
  wrong answer or a rambling one; the correct, concise answer is always preferred. Which
  completion is A is random; ``kind`` says what the rejected one is.
- ``word_problems.jsonl`` (1000) and ``word_problems_test.jsonl`` (200): arithmetic word
  problems in GSM8K's format (:mod:`tempering.assets.word_problems`).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tempering.assets.word_problems import word_problems

__all__ = ["NAMES", "generate"]

SEED = 20240611
SYSTEM = "Answer with the result only."
# fmt: off
WORDS = (
    "cat", "dog", "sun", "map", "cup", "pen", "hat", "box", "egg", "fox", "owl", "bee", "ant",
    "cow", "pig", "hen", "bus", "car", "van", "jet", "apple", "table", "chair", "water", "green",
    "house", "light", "music", "river", "stone", "bread", "cloud", "plant", "train", "tiger",
    "zebra", "lemon", "mango", "piano", "robot", "pilot", "tower",
)
# fmt: on


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"What is {a} * {b}?", str(a * b)
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    if op == "-":
        a, b = max(a, b), min(a, b)
        return f"What is {a} - {b}?", str(a - b)
    return f"What is {a} + {b}?", str(a + b)


def _word_task(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(WORDS)
    kind = rng.randrange(4)
    if kind == 0:
        return f'Reverse the word "{word}".', word[::-1]
    if kind == 1:
        return f'Write "{word}" in capital letters.', word.upper()
    if kind == 2:
        return f'How many letters are in "{word}"?', str(len(word))
    n = rng.randint(0, 998)
    return f"What number comes after {n}?", str(n + 1)


def _question(rng: random.Random) -> tuple[str, str]:
    return _arithmetic(rng) if rng.random() < 0.7 else _word_task(rng)


def _conversation(rng: random.Random) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    if rng.random() < 0.25:
        messages.append({"role": "system", "content": SYSTEM})
    for _ in range(2 if rng.random() < 0.2 else 1):
        question, answer = _question(rng)
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages


def _chat(rng: random.Random, count: int, exclude: set[str]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    while len(rows) < count:
        messages = _conversation(rng)
        questions = [m["content"] for m in messages if m["role"] == "user"]
        if any(q in exclude for q in questions):
            continue
        exclude.update(questions)
        rows.append({"messages": messages})
    return rows


def _wrong(rng: random.Random, answer: str) -> str:
    if answer.isdigit():
        n, delta = int(answer), rng.choice([-3, -2, -1, 1, 2, 3, 10])
        return str(n + delta if n + delta >= 0 else n - delta)
    return answer[1:] + answer[0] if len(set(answer)) > 1 else answer + answer[0]


def _rambling(rng: random.Random, answer: str) -> str:
    opener = rng.choice(
        [
            "Well, that is an interesting question, and there are many ways to think about it.",
            "Let me think about this carefully before I say anything, because details matter.",
            "Hmm, I am not completely sure, but I will try my best to work it out.",
        ]
    )
    return f"{opener} After some thought, I believe the answer is probably {answer}, if I am not mistaken."


def _preferences(rng: random.Random, count: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for _ in range(count):
        question, answer = _question(rng)
        kind = "incorrect" if rng.random() < 0.5 else "rambling"
        rejected = _wrong(rng, answer) if kind == "incorrect" else _rambling(rng, answer)
        if rejected == answer:
            raise AssertionError(f"generator bug: the rejected answer to {question!r} is correct")
        good = [{"role": "assistant", "content": answer}]
        bad = [{"role": "assistant", "content": rejected}]
        label = rng.choice("AB")
        rows.append(
            {
                "prompt_conversation": [{"role": "user", "content": question}],
                "completion_A": good if label == "A" else bad,
                "completion_B": bad if label == "A" else good,
                "label": label,
                "kind": kind,
            }
        )
    return rows


def _all() -> dict[str, list[dict[str, object]]]:
    rng = random.Random(SEED)
    seen: set[str] = set()
    train = _chat(rng, 400, seen)
    test = _chat(rng, 100, seen)
    return {
        "arithmetic_chat.jsonl": train,
        "arithmetic_chat_test.jsonl": test,
        "arithmetic_preferences.jsonl": _preferences(random.Random(SEED + 1), 300),
        **dict(zip(WORD_PROBLEM_NAMES, word_problems(SEED + 2, train=1000, test=200), strict=True)),
    }


WORD_PROBLEM_NAMES = ("word_problems.jsonl", "word_problems_test.jsonl")
NAMES = (
    "arithmetic_chat.jsonl",
    "arithmetic_chat_test.jsonl",
    "arithmetic_preferences.jsonl",
    *WORD_PROBLEM_NAMES,
)
"""The files this script writes."""


def generate(directory: str | Path) -> list[Path]:
    """Write every shipped data set into ``directory``; returns the paths written.

    Example::

        generate("python/tempering/assets")
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, rows in _all().items():
        path = out / name
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for p in generate(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent):
        print(p)
