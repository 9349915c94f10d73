"""``tempering recipe topk-distill`` at a tiny budget: the teacher is trained, the student's held-out
cross-entropy against the teacher's top-K falls, the SFT baseline runs beside it, and the summary
holds every figure. The real-model figures are in docs/recipes/topk-distill.md, not asserted here."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tempering import assets
from tempering.recipes import load_recipe
from tempering.recipes.stages import SFTStage
from tempering.recipes.topk_distill import TopKDistillRecipe


@pytest.mark.timeout(300)
def test_topk_distill_tiny_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPERING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TEMPERING_NUM_THREADS", "1")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    small = tmp_path / "test.jsonl"
    small.write_text("".join(assets.path("arithmetic_chat_test.jsonl").read_text().splitlines(True)[:16]))
    out = tmp_path / "run"
    recipe = TopKDistillRecipe(
        out=str(out), test_path=str(small), n_test=8, n_train=48, k=4, max_tokens=4, progress=False,
        teacher_sft=SFTStage(16, 16, schedule="linear"), student=SFTStage(12, 16, schedule="linear"),
    )  # fmt: skip
    result = asyncio.run(recipe())
    f = result.figures
    assert f["topk_nll_after"] < 0.9 * f["topk_nll_before"]
    for name in ("teacher", "before", "distill", "sft"):
        assert 0.0 <= f[f"exact_match_{name}"] <= 1.0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "topk-distill"
    assert set(summary["ci95"]) == {f"exact_match_{n}" for n in ("teacher", "before", "distill", "sft")}
    for stage in ("teacher", "distill", "sft"):
        assert (out / stage / "metrics.jsonl").exists()
    assert load_recipe("topk-distill") is TopKDistillRecipe


def test_topk_distill_bad_flags() -> None:
    with pytest.raises(ValueError, match=r"TopKDistillRecipe.k \(--k\) must be > 0"):
        TopKDistillRecipe(k=0)


def test_a_teacher_of_another_tokenizer_is_refused_before_it_is_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    import tempering.recipes.topk_distill as recipe_module
    from tempering.backend import load_tokenizer
    from tempering.sft.topk_distill import TeacherTokenizerMismatchError

    backend = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    other = PreTrainedTokenizerFast(tokenizer_object=backend)

    def tokenizer_of(name: str) -> object:
        return other if name == "acme/teacher" else load_tokenizer(name)

    monkeypatch.setattr(recipe_module, "load_tokenizer", tokenizer_of)
    monkeypatch.setenv("TEMPERING_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    recipe = TopKDistillRecipe(out=str(tmp_path / "run"), teacher_model="acme/teacher", progress=False)
    with pytest.raises(TeacherTokenizerMismatchError, match="teacher 'acme/teacher'"):
        asyncio.run(recipe())
    assert not (tmp_path / "run" / "teacher").exists()  # nothing was trained
