"""SDFT: a rewrite replaces its reference only when it keeps the final answer; the rewrite request
shows the question and the reference; the recipe runs at a tiny budget. Real-model figures:
docs/recipes/sdft.md."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tempering import assets
from tempering.recipes import load_recipe
from tempering.recipes.sdft import SDFTRecipe, read_pairs
from tempering.recipes.stages import SFTStage
from tempering.sft.sdft import final_answer, keeps_final_answer, rewrite_prompt, sdft_conversations

REF = "Tom has 23 cards and gives 7 away: 23 - 7 = <<23-7=16>>16\n#### 16"


def test_a_rewrite_must_keep_the_final_answer() -> None:
    assert final_answer(REF) == "16"
    assert keeps_final_answer("He gives away 7 of his 23 cards, so 16 are left. The answer is 16.", REF)
    assert not keeps_final_answer("He has 23 cards left.", REF)
    assert not keeps_final_answer("", REF)
    assert keeps_final_answer("It is TIGER.", "TIGER")  # no number: the text itself
    assert not keeps_final_answer("It is a cat.", "TIGER")


def test_sdft_conversations_fall_back_to_the_reference() -> None:
    pairs = [("How many are left?", REF), ("And now?", "#### 3")]
    conversations, kept = sdft_conversations(pairs, ["So 16 remain.", "I think 4."])
    assert kept == 1
    assert conversations[0][1]["content"] == "So 16 remain."
    assert conversations[1][1]["content"] == "#### 3"
    with pytest.raises(ValueError, match="1 rewrites for 2 questions"):
        sdft_conversations(pairs, ["x"])


def test_rewrite_prompt_shows_question_and_reference() -> None:
    (message,) = rewrite_prompt("How many are left?", REF)
    assert "How many are left?" in message["content"]
    assert "#### 16" in message["content"]
    with pytest.raises(ValueError, match=r"\{question\} and \{answer\}"):
        rewrite_prompt("q", "a", "no fields")
    with pytest.raises(ValueError, match=r"template \(--template\)"):
        SDFTRecipe(template="rewrite it")


def test_read_pairs_names_a_bad_row(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n{"prompt": "q"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a row"):
        read_pairs(str(bad), 10)


@pytest.mark.timeout(300)
def test_sdft_tiny_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPERING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TEMPERING_NUM_THREADS", "1")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    out = tmp_path / "run"
    recipe = SDFTRecipe(
        out=str(out),
        n_train=32,
        n_test=6,
        n_other=6,
        sft=SFTStage(6, 16, schedule="linear"),
        max_tokens=12,
        progress=False,
    )
    result = asyncio.run(recipe())
    f = result.figures
    for key in ("accuracy_before", "accuracy_sdft", "accuracy_sft", "other_sdft", "rewrites_kept"):
        assert 0.0 <= f[key] <= 1.0
    assert f["target_nll_sdft"] > 0
    assert f["target_nll_reference"] > 0
    rows = [json.loads(x) for x in (out / "data" / "sdft.jsonl").read_text().splitlines()]
    assert len(rows) == 32
    assert rows[0]["messages"][0]["content"] == read_pairs(str(assets.path("word_problems.jsonl")), 1)[0][0]
    assert (out / "sdft" / "metrics.jsonl").exists()
    assert (out / "sft" / "metrics.jsonl").exists()
    assert load_recipe("sdft") is SDFTRecipe
