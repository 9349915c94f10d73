"""``tempering recipe code-rl`` at a tiny budget, in a subprocess: it exits 0, writes its run
directories and a summary with the figures in range. The grading itself (the sandbox, the
rewards) is tested in tests/envs/test_code_env.py and tests/tools/; the full-budget figures are
in docs/recipes/code-rl.md, not a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from tempering.envs.code import load_code_problems
from tempering.recipes import load_recipe
from tempering.recipes.code_rl import CodeRLRecipe, write_solutions

_TINY = [
    "--sft-steps", "8", "--sft-batch-size", "8", "--rl-steps", "1", "--rl-batch-size", "2",
    "--group-size", "2", "--eval-samples", "1", "--max-tokens", "24", "--n-test", "4", "--eval-seeds", "2",
    "--no-progress",
]  # fmt: skip


def test_registry_names_the_recipe() -> None:
    assert load_recipe("code-rl") is CodeRLRecipe


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match=r"CodeRLRecipe\.group_size \(--group-size\) must be > 0"):
        CodeRLRecipe(group_size=0)
    with pytest.raises(ValueError, match=r"n_test must be in 0\.\.39"):
        CodeRLRecipe(n_test=40)
    with pytest.raises(ValueError, match="reward must be 'fraction' or 'all'"):
        CodeRLRecipe(reward="most")  # pyright: ignore[reportArgumentType]


def test_sft_rows_hold_the_solutions_in_a_python_block(tmp_path: Path) -> None:
    problems = load_code_problems()[:3]
    path = write_solutions(tmp_path / "sft.jsonl", problems, "sys")
    rows = [json.loads(x)["messages"] for x in path.read_text().splitlines()]
    assert [r[0]["content"] for r in rows] == ["sys"] * 3
    assert [r[1]["content"] for r in rows] == [p.prompt for p in problems]
    assert [r[2]["content"] for r in rows] == [f"```python\n{p.solution}```" for p in problems]


@pytest.mark.timeout(300)
def test_recipe_tiny_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "code-rl", *_TINY, "--out", str(out)],
        capture_output=True, text=True, timeout=280, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run directory: {out}" in proc.stdout
    assert "tempering recipe code-rl: sft_train_pass_fraction" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "code-rl"
    for key in ("sft_train_pass_fraction", "sft_test_all_pass", "rl_train_pass_fraction", "rl_test_all_pass"):
        assert 0.0 <= summary[key] <= 1.0
    for key in ("sft_test_pass_fraction_sd", "rl_test_all_pass_sd"):  # spread over the 2 eval seeds
        assert summary[key] >= 0.0
    assert "base_test_pass_fraction" not in summary  # the tiny model: no untrained evaluation
    assert summary["evaluation"]["rl_train_replies"] == 36  # 36 training problems x 1 sample
    assert summary["evaluation"]["rl_test_replies"] == 4
    assert not set(summary["train_problems"]) & set(summary["test_problems"])
    assert len((out / "data" / "train.jsonl").read_text().splitlines()) == 36
    rl = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rl] == [0]
    assert all("env/reward/mean" in x for x in rl)


def test_without_sft_the_figures_before_rl_are_the_base_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--sft-steps 0``: RL starts from the base model, which is evaluated first (``base_*``);
    ``--no-eval-train`` evaluates the held-out problems only."""
    import asyncio

    monkeypatch.setenv("TEMPERING_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    out = tmp_path / "run"
    defaults = CodeRLRecipe()
    recipe = CodeRLRecipe(
        out=str(out), sft=attrs.evolve(defaults.sft, steps=0),
        rl=attrs.evolve(defaults.rl, steps=1, batch_size=1, eval_every=0), group_size=2, eval_samples=1,
        max_tokens=8, n_test=4, eval_seeds=2, eval_train=False, progress=False,
    )  # fmt: skip
    asyncio.run(recipe())
    summary = json.loads((out / "summary.json").read_text())
    for stage in ("base", "rl"):
        assert 0.0 <= summary[f"{stage}_test_pass_fraction"] <= 1.0
        assert summary[f"{stage}_test_pass_fraction_sd"] >= 0.0
        assert summary["evaluation"][f"{stage}_test_replies"] == 4
    assert not any(k.startswith("sft_") for k in summary)
    assert not any("_train_" in k for k in summary["evaluation"])  # --no-eval-train: held-out only
