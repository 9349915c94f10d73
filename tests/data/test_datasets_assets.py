"""The shipped data sets: found by name, valid, correct, and reproduced by their generator."""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

import pytest
from reference_oracle import families  # pyright: ignore[reportMissingImports]  # on sys.path via conftest
from reference_oracle import make_tokenizer as family_tokenizer  # pyright: ignore[reportMissingImports]
from renderer_tokenizers import make_tokenizer  # pyright: ignore[reportMissingImports]  # on sys.path via conftest

from tempering import assets
from tempering.assets.generate import NAMES, generate
from tempering.data import load_chat, load_comparisons
from tempering.renderers import RENDERERS, get_renderer, render_supervised_batch_sync
from tempering_protocols import Message, Tokenizer

SIZES = {
    "arithmetic_chat.jsonl": 400,
    "arithmetic_chat_test.jsonl": 100,
    "arithmetic_preferences.jsonl": 300,
    "word_problems.jsonl": 1000,
    "word_problems_test.jsonl": 200,
}


def test_names_and_paths() -> None:
    assert assets.names() == sorted(SIZES) == sorted(NAMES)
    for name in SIZES:
        assert assets.path(name).is_file()
    with pytest.raises(FileNotFoundError, match=r"there are: arithmetic_chat\.jsonl"):
        assets.path("nope.jsonl")


def test_generator_reproduces_the_shipped_files(tmp_path: Path) -> None:
    for written in generate(tmp_path):
        assert written.read_bytes() == assets.path(written.name).read_bytes(), written.name


def answer(question: str) -> str:
    """The right answer to a generated question, worked out independently of the generator."""
    if m := re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", question):
        a, op, b = int(m[1]), m[2], int(m[3])
        return str(a + b if op == "+" else a - b if op == "-" else a * b)
    if m := re.fullmatch(r'Reverse the word "(\w+)"\.', question):
        return m[1][::-1]
    if m := re.fullmatch(r'Write "(\w+)" in capital letters\.', question):
        return m[1].upper()
    if m := re.fullmatch(r'How many letters are in "(\w+)"\?', question):
        return str(len(m[1]))
    if m := re.fullmatch(r"What number comes after (\d+)\?", question):
        return str(int(m[1]) + 1)
    raise AssertionError(f"unexpected question {question!r}")


def test_chat_data_is_correct_and_disjoint() -> None:
    questions: dict[str, set[str]] = {}
    for name in ("arithmetic_chat.jsonl", "arithmetic_chat_test.jsonl"):
        data = load_chat(assets.path(name))
        assert len(data) == SIZES[name]
        assert data.bad_rows.count == 0
        questions[name] = set()
        for convo in data.items:
            assert convo[-1]["role"] == "assistant"
            body = convo[1:] if convo[0]["role"] == "system" else convo
            assert [m["role"] for m in body] == ["user", "assistant"] * (len(body) // 2)
            for q, a in zip(body[::2], body[1::2], strict=True):
                assert a["content"] == answer(q["content"])
                questions[name].add(q["content"])
    assert not questions["arithmetic_chat.jsonl"] & questions["arithmetic_chat_test.jsonl"]


def test_preferences_prefer_the_correct_concise_answer() -> None:
    data = load_comparisons(assets.path("arithmetic_preferences.jsonl"))
    assert len(data) == SIZES["arithmetic_preferences.jsonl"]
    labels = {"A": 0, "B": 0}
    for item in data.items:
        c = item.comparison
        assert item.label in labels
        labels[item.label] += 1
        chosen, rejected = (
            (c.completion_A, c.completion_B) if item.label == "A" else (c.completion_B, c.completion_A)
        )
        right = answer(c.prompt_conversation[0]["content"])
        assert chosen[0]["content"] == right
        assert rejected[0]["content"] != right
        assert len(rejected[0]["content"]) > len(right) or not rejected[0]["content"].startswith("Well")
    assert min(labels.values()) > 100  # both positions are used


def _tokenizer_for(name: str) -> object:
    """The renderer tests' tokenizer for ``name``'s family (its special tokens), else the shared one."""
    for family in families():
        if name in family.names:
            return family_tokenizer(family.spec)
    return make_tokenizer()


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_every_shipped_conversation_renders(name: str) -> None:
    renderer = get_renderer(name, cast("Tokenizer", _tokenizer_for(name)))
    convos: list[list[Message]] = list(load_chat(assets.path("arithmetic_chat_test.jsonl")).items)
    examples = render_supervised_batch_sync(renderer, convos, "all_assistant_messages")
    assert all(ex.weights.any() for ex in examples)
