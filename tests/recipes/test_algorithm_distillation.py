"""``tempering recipe algorithm-distillation`` at a tiny budget, in a subprocess, in both formats:
the histories, the models' run directories, the in-context curves and the summary. The
full-budget figures are in docs/recipes/algorithm-distillation.md, not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tempering.ad import read_histories
from tempering.training import RunDir


def test_recipe_tiny_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "algorithm-distillation", "--task", "darkroom",
         "--n-tasks", "4", "--n-episodes", "6", "--window", "40", "--final-episodes", "2",
         "--eval-tasks", "3",
         "--eval-episodes", "3", "--steps", "4", "--batch-size", "4", "--d-model", "16", "--n-layers", "1",
         "--device", "cpu", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    for name in ("ad", "ed", "source", "random"):
        assert f"{name}_regret" in summary
        assert f"{name}_last_return" in summary
    curves = RunDir(out / "in-context").read_metrics()
    assert [c["step"] for c in curves] == [0, 1, 2]
    assert {"return/ad", "return/ed", "return/source", "return/random"} <= set(curves[0])
    assert [m["step"] for m in RunDir(out / "ad-model").read_metrics()] == [0, 3]  # every 10th, the last
    assert read_histories(out / "histories").n_tasks == 4
    model_config = json.loads((out / "ad-model" / "config.json").read_text())
    assert model_config["model"]["grid_width"] == 9  # Dark Room's states: row + column embeddings


def test_recipe_language_format_tiny_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "algorithm-distillation", "--task", "guess-number",
         "--format", "language", "--n-tasks", "4", "--sft-steps", "3", "--sft.batch-size", "4",
         "--eval-tasks", "2", "--eval-episodes", "2", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TEMPERING_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    rows = (out / "language" / "train.jsonl").read_text().splitlines()
    assert len(rows) == summary["lm_windows"] == 4 * 5  # windows of 4 episodes in 8, every episode
    first = json.loads(rows[0])["messages"]
    assert first[1] == {"role": "user", "content": "Episode starts. start"}
    assert len(RunDir(out / "lm-model").read_metrics()) == 3
    # expert distillation in text: the windows of each task's last 4 episodes (one window each)
    ed_rows = [json.loads(r)["messages"] for r in (out / "language" / "lm-ed.jsonl").read_text().splitlines()]
    assert len(ed_rows) == summary["lm_ed_windows"] == 4
    assert all(m in [json.loads(r)["messages"] for r in rows] for m in ed_rows)  # AD's last windows
    assert len(RunDir(out / "lm-ed-model").read_metrics()) == 3
    # 2 tasks x 2 episodes x 6 guesses, each a reply parsed to a guess or counted invalid
    assert 0 <= summary["lm_invalid_actions"] <= 24
    assert 0 <= summary["lm_ed_invalid_actions"] <= 24
    assert {"return/lm", "return/lm_ed", "return/source", "return/random"} <= set(
        RunDir(out / "in-context").read_metrics()[0]
    )
    assert {"lm_regret", "lm_ed_regret", "source_regret", "random_regret"} <= set(summary)
    assert summary["source_last_return"] == 6  # the scripted learner remembers the number


def test_recipe_darkroom_language_format_tiny_budget(tmp_path: Path) -> None:
    """Dark Room in text: by default a window of 2 episodes (the RL format's 4 do not fit the
    tiny model's context), cells as ``(row,col)``, replies read back as moves."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "algorithm-distillation", "--task", "darkroom",
         "--format", "language", "--n-tasks", "2", "--n-episodes", "3", "--final-episodes", "2",
         "--sft-steps", "2", "--sft.batch-size", "2", "--eval-tasks", "1", "--eval-episodes", "2",
         "--no-progress", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TEMPERING_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sizes"]["window"] == 40
    rows = [json.loads(r)["messages"] for r in (out / "language" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == summary["lm_windows"] == 2 * 2  # windows of 2 episodes in 3, every episode
    assert summary["lm_ed_windows"] == 2  # each task's last 2 episodes
    assert rows[0][1] == {"role": "user", "content": "Episode starts. (4,4)"}
    replies = [m["content"] for m in rows[0] if m["role"] == "assistant"]
    assert len(replies) == 40
    assert set(replies) <= {"stay", "up", "down", "left", "right"}
    assert 0 <= summary["lm_invalid_actions"] <= 2 * 20  # 1 task x 2 episodes x 20 steps
    curves = RunDir(out / "in-context").read_metrics()
    assert [c["step"] for c in curves] == [0, 1]
    assert {"return/lm", "return/lm_ed", "return/source", "return/random"} <= set(curves[0])


def test_xy_states_need_a_grid_task() -> None:
    from tempering.recipes.algorithm_distillation import AlgorithmDistillationRecipe

    message = r"--state-embedding xy needs a grid task \(darkroom\), but --task is bandit"
    with pytest.raises(ValueError, match=message):
        AlgorithmDistillationRecipe(task="bandit", state_embedding="xy", out="/nonexistent")


def test_recipe_expert_ed_data_tiny_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "algorithm-distillation", "--task", "bandit",
         "--ed-data", "expert", "--n-tasks", "4", "--n-episodes", "30", "--window", "10", "--stride", "10",
         "--final-episodes", "10", "--eval-tasks", "2", "--eval-episodes", "5", "--steps", "2",
         "--batch-size", "4", "--d-model", "16", "--n-layers", "1", "--device", "cpu", "--no-progress",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TEMPERING_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    expert = read_histories(out / "expert-histories")
    assert expert.n_tasks == 4
    assert (expert.logprob_R == 0).all()  # the oracle, not Thompson sampling
    assert summary["ed_windows"] == 4 * 3  # every window of the expert's 30 pulls, not the last 10
    assert summary["ad_windows"] == 4 * 3
    assert "ed_regret" in summary


def test_expert_ed_data_is_for_bandits_only() -> None:
    from tempering.recipes.algorithm_distillation import AlgorithmDistillationRecipe

    with pytest.raises(ValueError, match="--ed-data expert has an expert for the bandit task only"):
        AlgorithmDistillationRecipe(task="darkroom", ed_data="expert", out="/nonexistent")


def test_language_window_longer_than_the_models_context_fails_before_training(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "algorithm-distillation", "--task", "bandit",
         "--format", "language", "--n-tasks", "2", "--n-episodes", "40", "--window", "40",
         "--final-episodes", "40", "--sft-steps", "1", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TEMPERING_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode != 0
    # 40 bandit transitions are 2589 byte-level tokens; the tiny model's context is 2048
    assert "a window of 40 transitions is" in proc.stderr
    assert "longer than its context of 2048 tokens; lower --window (about 31 transitions fit)" in proc.stderr
    assert not (out / "lm-model").exists()


def test_recipe_rl_source_tiny_budget(tmp_path: Path) -> None:
    """``--source rl``: an SFT warm start and an RL run on the guess-number env (the tiny model),
    whose log becomes the histories the models train on."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "algorithm-distillation", "--task", "guess-number",
         "--source", "rl", "--source-sft.steps", "4", "--source-sft-games", "40", "--source-rl.steps", "3",
         "--source-group-size", "2", "--window", "12", "--final-episodes", "2", "--eval-tasks", "2",
         "--eval-episodes", "3", "--steps", "2", "--batch-size", "4", "--d-model", "16", "--n-layers", "1",
         "--device", "cpu", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TEMPERING_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    histories = read_histories(out / "histories")
    assert histories.n_tasks == 8 * 2  # the 8 training numbers x 2 games a step
    assert histories.returns_NE().shape == (16, 3)  # one episode per RL step
    assert histories.horizon == 6
    assert len(RunDir(out / "source-rl").read_metrics()) >= 3
    assert len(list((out / "source-rl" / "trajectories" / "rl").glob("step-*.parquet"))) == 3
    assert summary["ad_windows"] == 16 * 2  # windows of 2 episodes in 3, every episode
    assert summary["source_first_return"] == pytest.approx(histories.returns_NE()[:, 0].mean())
    assert summary["scripted_last_return"] == 1  # binary search, then the number remembered
    for name in ("ad", "ed", "source", "scripted", "random"):
        assert f"{name}_regret" in summary
    assert {"return/ad", "return/source", "return/scripted"} <= set(
        RunDir(out / "in-context").read_metrics()[0]
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task": "bandit"}, "--source rl runs RL on the guess-number env, but --task is bandit"),
        ({"task": "guess-number", "n_tasks": 4}, "leave --n-tasks and --n-episodes unset"),
        (
            {"task": "guess-number", "eval_episodes": 70},
            r"--eval-episodes 70 is more than the RL source's 60 steps",
        ),
    ],
)
def test_rl_source_options_are_checked(options: dict[str, Any], message: str) -> None:
    from tempering.recipes.algorithm_distillation import AlgorithmDistillationRecipe

    with pytest.raises(ValueError, match=message):
        AlgorithmDistillationRecipe(source="rl", out="/nonexistent", **options)
