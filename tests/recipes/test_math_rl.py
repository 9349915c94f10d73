"""``tempering recipe math-rl`` at a tiny budget, in a subprocess: it exits 0, writes its run
directories, and its summary holds the held-out figures before and after RL. The full-budget
figures are in docs/recipes/math-rl.md, not a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tempering.data.hub import MathProblem
from tempering.recipes import load_recipe
from tempering.recipes.math_rl import MathRLRecipe, WarmUp, write_sft_chat
from tempering.recipes.stages import SFTStage

_TINY = [
    "--sft-steps", "6", "--sft-batch-size", "8", "--rl-steps", "2", "--rl-batch-size", "2",
    "--group-size", "2", "--n-test", "4", "--eval-seeds", "2", "--eval-samples", "2",
    "--max-tokens", "12", "--n-train", "64", "--no-progress",
]  # fmt: skip


def test_registry_names_the_recipe() -> None:
    assert load_recipe("math-rl") is MathRLRecipe


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match=r"MathRLRecipe.group_size \(--group-size\) must be > 0"):
        MathRLRecipe(group_size=0)
    with pytest.raises(ValueError, match="unknown dataset 'gsm9k'"):
        MathRLRecipe(dataset="gsm9k")
    with pytest.raises(ValueError, match=r"WarmUp\.steps must be >= 0, got -1"):
        MathRLRecipe(sft=WarmUp(steps=-1))


def test_defaults_follow_the_model() -> None:
    tiny = MathRLRecipe()
    assert tiny.task().source == "tempering-assets:word_problems.jsonl"
    assert tiny.prompt_instruction is None
    hosted = MathRLRecipe(base_model="Qwen/Qwen3.5-9B")
    assert hosted.task().source is None  # the dataset's hub name
    assert hosted.prompt_instruction == "Put the final answer in \\boxed{}."
    # the SFT warm-up's steps follow the model: the tiny model starts from random weights
    assert tiny.sft.stage(tiny.tiny) == SFTStage(300, 32, 2e-3, weight_decay=0.1)
    assert hosted.sft.stage(hosted.tiny).steps == 0
    assert MathRLRecipe(sft=WarmUp(steps=7)).sft.stage(True).steps == 7


def test_sft_rows_end_in_a_boxed_answer(tmp_path: Path) -> None:
    problems = [
        MathProblem(
            "Tom has 3 bags of 4 pens. How many pens in all?", "12", "r1", "3 * 4 = <<3*4=12>>12\n#### 12"
        ),
        MathProblem("What is 1/2 + 1/3?", "\\frac{5}{6}", "r2"),
    ]
    path = write_sft_chat(problems, tmp_path / "sft.jsonl", "Box it.")
    rows = [json.loads(line)["messages"] for line in path.read_text().splitlines()]
    assert rows[0][0]["content"].endswith("\n\nBox it.")
    assert rows[0][1]["content"] == "3 * 4 = 12\n\\boxed{12}"
    assert rows[1][1]["content"] == "\\boxed{\\frac{5}{6}}"


@pytest.mark.timeout(400)
def test_recipe_tiny_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "math-rl", *_TINY, "--out", str(out)],
        capture_output=True, text=True, timeout=380, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run directory: {out}" in proc.stdout
    assert "tempering recipe math-rl: before RL: held-out accuracy" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "math-rl"
    for stage in ("before", "after"):
        for key in ("accuracy", "accuracy_greedy", "boxed", "boxed_greedy"):
            assert 0.0 <= summary[f"{stage}_{key}"] <= 1.0
        assert len([k for k in summary[stage] if k.startswith("accuracy_seed")]) == 2
    assert summary["n_test"] == 4
    assert summary["grader"]["evaluation"]["grader/calls"] > 0
    assert summary["grader"]["rl"]["env/grader/timeouts"] == 0.0
    assert summary["config"]["group_size"] == 2

    rows = (out / "data" / "train.jsonl").read_text().splitlines()
    assert len(rows) == 64
    assert json.loads(rows[0])["messages"][1]["content"].endswith("}")
    sft = [json.loads(x) for x in (out / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in sft] == list(range(6))
    rl = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rl] == [0, 1]
    assert all("env/reward/mean" in x and "env/correct" in x for x in rl)
    assert all(x["env/grader/timeouts"] == 0.0 for x in rl)  # counted, none here
