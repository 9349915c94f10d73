"""``tempering recipe guess-number`` at a tiny budget, in a subprocess: it exits 0, writes its run
directories, and its summary holds the figures in range. The full-budget figures are in
docs/recipes/guess-number.md, not a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from tempering.envs.game_data import write_transcripts
from tempering.envs.guess_number import GuessNumberRules
from tempering.recipes import load_recipe
from tempering.recipes.guess_number import GuessNumberRecipe

_TINY = [
    "--sft-games", "200", "--sft-steps", "16", "--sft-batch-size", "16",
    "--rl-steps", "2", "--rl-batch-size", "2", "--group-size", "4", "--rl-eval-every", "1",
    "--n-test-secrets", "2", "--eval-samples", "4", "--eval-seeds", "2", "--no-progress",
]  # fmt: skip


def test_registry_names_the_recipe() -> None:
    assert load_recipe("guess-number") is GuessNumberRecipe


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match=r"GuessNumberRecipe\.group_size \(--group-size\) must be > 0"):
        GuessNumberRecipe(group_size=0)
    with pytest.raises(ValueError, match=r"n_test_secrets must be in 0\.\.7"):
        GuessNumberRecipe(rules=GuessNumberRules(low=0, high=7), n_test_secrets=8)
    with pytest.raises(ValueError, match="teacher"):
        GuessNumberRecipe(teacher="oracle")  # pyright: ignore[reportArgumentType]


def test_transcripts_follow_the_rules(tmp_path: Path) -> None:
    path = write_transcripts(
        tmp_path / "t.jsonl", (3, 9), n_games=50, teacher="bisect", low=0, high=15, max_turns=5, seed=0
    )
    rows = [json.loads(line)["messages"] for line in path.read_text().splitlines()]
    assert len(rows) == 50
    for messages in rows:
        assert messages[0] == {"role": "user", "content": "Guess a number from 0 to 15."}
        assert messages[-1]["role"] == "assistant"
        assert int(messages[-1]["content"]) in (3, 9)  # bisection always ends on the secret
        assert [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2)


def test_recipe_tiny_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "guess-number", *_TINY, "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run directory: {out}" in proc.stdout
    assert "tempering recipe guess-number: sft_success" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "guess-number"
    for stage in ("sft", "rl"):
        assert 0.0 <= summary[f"{stage}_success"] <= 1.0
        assert 0.0 <= summary[f"{stage}_invalid"] <= 1.0
        assert 1.0 <= summary[f"{stage}_turns"] <= 5.0
        assert summary[stage]["episodes"] == 2 * 4 * 2  # held-out secrets x eval samples x eval seeds
        spread = summary["spread"][f"{stage}_success"]
        assert spread["seeds"] == [7919, 7920]
        assert len(spread["values"]) == 2
        assert summary[f"{stage}_success"] == pytest.approx(sum(spread["values"]) / 2)
        assert summary[f"{stage}_success_sd"] == pytest.approx(spread["sd"])
    assert "base_success" not in summary  # the tiny model starts from random weights: no untrained evaluation
    assert summary["wall_seconds"] > 0
    assert summary["scripted"]["bisect_success"] == 1.0
    assert len(summary["eval_secrets"]) == 2
    assert not set(summary["eval_secrets"]) & set(summary["train_secrets"])
    assert summary["config"]["group_size"] == 4

    assert (out / "data" / "train.jsonl").stat().st_size > 0
    sft = [json.loads(x) for x in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in sft] == list(range(16))
    assert sft[-1]["loss"] < 0.6 * sft[0]["loss"]  # SFT learns the format
    rl = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rl] == [0, 1]
    assert all("env/reward/mean" in x and "env/correct" in x for x in rl)
    assert "test/correct" in rl[-1]
    for stage in ("sft", "rl"):
        assert (out / stage / "checkpoints.jsonl").read_text().strip()


def test_a_pretrained_model_is_evaluated_untrained_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pretrained model (here the tiny one taken for one: only the model-aware choice is
    patched) is evaluated before SFT too, so the page can say where it started."""
    import asyncio

    import tempering.recipes.guess_number as guess_number

    monkeypatch.setenv("TEMPERING_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.setattr(guess_number, "trains_tiny_from_scratch", lambda base_model: False)
    out = tmp_path / "run"
    defaults = GuessNumberRecipe()
    recipe = GuessNumberRecipe(
        out=str(out), sft_games=100, sft=attrs.evolve(defaults.sft, steps=2, batch_size=8),
        rl=attrs.evolve(defaults.rl, steps=1, batch_size=1, eval_every=0), group_size=2, n_test_secrets=2,
        eval_samples=2, eval_seeds=2, lora_rank=0, progress=False,
    )  # fmt: skip
    asyncio.run(recipe())
    summary = json.loads((out / "summary.json").read_text())
    for stage in ("base", "sft", "rl"):
        assert summary[stage]["episodes"] == 2 * 2 * 2
        assert 0.0 <= summary[f"{stage}_success"] <= 1.0
        assert len(summary["spread"][f"{stage}_success"]["values"]) == 2
