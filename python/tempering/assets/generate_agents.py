"""Regenerate the agent data sets in ``assets/agents/``, deterministically:
``python -m tempering.assets.generate_agents [DIR]``.

- ``agents/tool_use_corpus.jsonl`` (60 rows): one short document per fictional town (made-up
  names, so no model knows the facts): ``{"text", "town", "river", "founded", "population"}``.
  The ``tool-use`` recipe searches the ``text`` with BM25 and asks questions about the facts.
- ``agents/twenty_questions_words.jsonl`` (36 rows): the secret words of twenty questions,
  ``{"word", "category"}``, six categories of six words.

They live in a subdirectory so ``tempering.assets.names()`` (the chat data sets) does not list
them; ``tempering.assets.path("agents/tool_use_corpus.jsonl")`` finds them.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

__all__ = ["AGENT_NAMES", "CATEGORIES", "generate_agents"]

SEED = 20261124
AGENT_NAMES = ("agents/tool_use_corpus.jsonl", "agents/twenty_questions_words.jsonl")
CATEGORIES: dict[str, tuple[str, ...]] = {
    "animal": ("cat", "dog", "horse", "rabbit", "eagle", "shark"),
    "fruit": ("apple", "banana", "cherry", "lemon", "mango", "grape"),
    "vehicle": ("car", "bus", "train", "bicycle", "boat", "plane"),
    "tool": ("hammer", "saw", "drill", "wrench", "shovel", "ladder"),
    "color": ("red", "blue", "green", "yellow", "purple", "orange"),
    "instrument": ("piano", "guitar", "violin", "drum", "flute", "trumpet"),
}
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "st", "kl", "dr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
_CODAS = ("", "n", "r", "l", "m", "s", "th", "k")


def _name(rng: random.Random, syllables: int) -> str:
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
    ).title()


def _corpus(rng: random.Random, n: int) -> list[dict[str, object]]:
    towns: set[str] = set()
    rows: list[dict[str, object]] = []
    while len(rows) < n:
        town = _name(rng, 2)
        if town in towns:
            continue
        towns.add(town)
        river, founded, population = _name(rng, 1), rng.randint(1100, 1950), rng.randint(800, 99000)
        text = (
            f"{town} is a town on the river {river}. "
            f"It was founded in {founded} and has {population} inhabitants."
        )
        rows.append(
            {"text": text, "town": town, "river": river, "founded": founded, "population": population}
        )
    return rows


def generate_agents(directory: str | Path) -> list[Path]:
    """Write the agent data sets under ``directory`` (``agents/…``); returns the paths."""
    root = Path(directory)
    (root / "agents").mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    corpus = root / AGENT_NAMES[0]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in _corpus(rng, 60)), encoding="utf-8")
    words = root / AGENT_NAMES[1]
    lines = [json.dumps({"word": w, "category": c}) + "\n" for c, ws in CATEGORIES.items() for w in ws]
    words.write_text("".join(lines), encoding="utf-8")
    return [corpus, words]


if __name__ == "__main__":
    for written in generate_agents(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent):
        print(written)
