"""The agent data sets (assets/agents/): reproduced by their generator, valid, searchable."""

from __future__ import annotations

import json
from pathlib import Path

from tempering import assets
from tempering.assets.generate_agents import AGENT_NAMES, generate_agents
from tempering.tools.search import BM25Search, load_corpus


def test_generator_reproduces_the_shipped_agent_files(tmp_path: Path) -> None:
    written = generate_agents(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == list(AGENT_NAMES)
    for path, name in zip(written, AGENT_NAMES, strict=True):
        assert path.read_bytes() == assets.path(name).read_bytes(), name
    assert "agents/tool_use_corpus.jsonl" not in assets.names()  # the chat data sets only


def test_the_corpus_answers_its_own_questions() -> None:
    path = assets.path("agents/tool_use_corpus.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 60
    assert len({r["town"] for r in rows}) == 60
    index = BM25Search(load_corpus(path), top_k=1)
    for row in rows[:20]:
        found = index.search(f"How many people live in {row['town']}?")
        assert f"has {row['population']} inhabitants" in found, row["town"]
