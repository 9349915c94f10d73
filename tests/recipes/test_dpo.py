"""``tempering recipe dpo`` at a tiny budget, in a subprocess: SFT then DPO, the run
directories, the summary, its agreement with the trainer's own held-out metrics, the direction
(held-out DPO loss falls, the implicit reward margin is positive), and a second run that starts
from the first one's SFT checkpoint (``--init-state``) with no SFT stage. The full-budget
figures are in docs/recipes/dpo.md."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tempering import assets
from tempering.preference import ComparisonData
from tempering.preference.evaluation import chosen_answers
from tempering.recipes.chat_sft import chat_stage
from tempering.recipes.dpo import DPORecipe, preference_stage

_TINY = [
    "--sft-steps", "20", "--sft-batch-size", "8", "--sft-eval-every", "0",
    "--dpo-steps", "6", "--dpo-batch-size", "4", "--dpo-learning-rate", "2e-3", "--test-pairs", "16",
    "--eval-every", "0", "--show", "2", "--no-progress",
]  # fmt: skip


def _run(tmp_path: Path, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    # 20 of the 100 held-out chats keep the SFT stage's evaluation short.
    small = tmp_path / "chat_test_20.jsonl"
    if not small.exists():
        small.write_text("".join(assets.path("arithmetic_chat_test.jsonl").read_text().splitlines(True)[:20]))
    return subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "dpo", "--sft-test-path", str(small), *flags,
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_dpo_tiny_budget_and_init_state(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _run(tmp_path, out, *_TINY)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run directory: {out}" in proc.stdout
    assert "held-out replies" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "dpo"
    assert summary["test_pairs"] == 16
    for key in (
        "preference_accuracy_before", "preference_accuracy_after", "reward_accuracy",
        "answer_accuracy_before", "answer_accuracy_after",
    ):  # fmt: skip
        assert 0.0 <= summary[key] <= 1.0, key
    assert summary["stages"] == {"sft": str(out / "sft"), "dpo": str(out / "dpo")}
    for stage in ("sft", "dpo"):
        assert (out / stage / "metrics.jsonl").is_file()
        assert (out / stage / "checkpoints.jsonl").is_file()

    # The summary's figures (from sampling clients) agree with the trainer's (from forward).
    dpo = [json.loads(x) for x in (out / "dpo" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in dpo] == list(range(6))
    assert summary["dpo_loss_before"] == pytest.approx(math.log(2), abs=1e-4)
    assert summary["reward_accuracy"] == pytest.approx(dpo[-1]["test/dpo_accuracy"], abs=0.051)
    assert summary["preference_accuracy_after"] == pytest.approx(dpo[-1]["test/policy_accuracy"], abs=0.051)
    assert summary["preference_accuracy_before"] == pytest.approx(
        dpo[0]["initial/test/policy_accuracy"], abs=0.051
    )
    # The direction at this budget (fixed seeds): DPO pulls chosen above rejected on held-out pairs.
    assert summary["dpo_loss_after"] < 0.9 * summary["dpo_loss_before"]
    assert summary["reward_margin"] > 0
    assert summary["reward_accuracy"] > 0.5

    # A second run from the first one's SFT checkpoint: no SFT stage, the same reference.
    sft_state = json.loads((out / "sft" / "checkpoints.jsonl").read_text().splitlines()[-1])["state_path"]
    out2 = tmp_path / "from-state"
    tiny = [*_TINY]
    tiny[tiny.index("--dpo-steps") + 1] = "2"  # a flag is given once (a repeat is refused)
    proc = _run(tmp_path, out2, *tiny, "--init-state", sft_state)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary2 = json.loads((out2 / "summary.json").read_text())
    assert summary2["init_state"] == sft_state
    assert summary2["stages"] == {"dpo": str(out2 / "dpo")}
    assert not (out2 / "sft").exists()
    # Same starting weights, same held-out pairs: the same "before".
    assert summary2["preference_accuracy_before"] == summary["preference_accuracy_before"]
    assert summary2["logprob_margin_before"] == pytest.approx(summary["logprob_margin_before"], rel=1e-4)


def test_bad_config_names_the_flag() -> None:
    with pytest.raises(ValueError, match=r"DPORecipe\.beta \(--beta\) must be > 0, got 0"):
        DPORecipe(beta=0.0)
    with pytest.raises(ValueError, match=r"DPORecipe\.dpo\.steps \(--dpo\.steps\) must be > 0"):
        DPORecipe(dpo=preference_stage(0, 8, 20))
    DPORecipe(sft=chat_stage(0), init_state="tempering://some/weights/final")  # no SFT stage: allowed


def test_pairs_split_and_refusals_name_the_flag() -> None:
    recipe = DPORecipe(test_pairs=16)
    data, n_train, test_pairs = recipe.pairs(4, "--dpo.batch-size")
    assert (data.batch_size, data.test_size, len(test_pairs)) == (4, 16, 16)
    assert n_train >= 1
    stage = recipe.dpo  # 5 warmup steps, linear decay, Adam's beta2 0.95
    assert (stage.steps, stage.batch_size, stage.eval_every, stage.schedule, stage.beta2) == (
        60,
        8,
        20,
        "linear",
        0.95,
    )
    with pytest.raises(
        ValueError, match=r"DPORecipe: .* fewer training pairs than one batch \(--dpo\.batch-size 100000\)"
    ):
        recipe.pairs(100_000, "--dpo.batch-size")


def test_chosen_answers_follow_the_label() -> None:
    _, test = ComparisonData(test_size=10)()
    assert test is not None
    items = chosen_answers(test.items)
    assert len(items) == 10
    for pair, (prompt, answer) in zip(test.items, items, strict=True):
        c = pair.comparison
        chosen = c.completion_A if pair.label == "A" else c.completion_B
        assert prompt == list(c.prompt_conversation)
        assert answer == chosen[-1]["content"]
