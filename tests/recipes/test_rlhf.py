"""``tempering recipe rlhf`` at a tiny budget, in a subprocess: SFT, reward model and RL run
directories, the summary and what can be checked at this budget (the reward model's training
loss falls; RL logs its held-out reward against the reference every evaluation). The full-budget
figures are in docs/recipes/rlhf.md. Also: the datasets and builders the recipe hands to RL."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from tempering import assets
from tempering.envs import PreferenceModel as EnvPreferenceModel
from tempering.envs.preference import PromptGroups
from tempering.preference import ComparisonData
from tempering.preference.rlhf import ComparisonJudge, RewardModelPrompts
from tempering.recipes.dpo import preference_stage
from tempering.recipes.rlhf import RLHFRecipe
from tempering_protocols import Comparison, Env, EnvGroupBuilder, Message

_TINY = [
    "--sft-steps", "20", "--sft-batch-size", "8", "--sft-eval-every", "0",
    "--rm-steps", "8", "--rm-batch-size", "4", "--rm-eval-every", "0", "--test-pairs", "12",
    "--rl-steps", "3", "--rl-prompts", "2", "--group-size", "3", "--eval-every", "2",
    "--eval-samples", "1", "--max-tokens", "8", "--show", "2", "--no-progress",
]  # fmt: skip


def test_rlhf_tiny_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    small = tmp_path / "chat_test_20.jsonl"  # 20 of the 100 held-out chats: a short SFT evaluation
    small.write_text("".join(assets.path("arithmetic_chat_test.jsonl").read_text().splitlines(True)[:20]))
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "rlhf", *_TINY, "--sft-test-path", str(small),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"run directory: {out}" in proc.stdout
    assert "held-out replies" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "rlhf"
    for key in (
        "rm_accuracy_before", "rm_accuracy_after", "rm_reward_before", "rm_reward_after",
        "answer_accuracy_before", "answer_accuracy_after",
    ):  # fmt: skip
        assert 0.0 <= summary[key] <= 1.0, key
    assert summary["reply_chars_before"] >= 0
    assert summary["stages"] == {"sft": str(out / "sft"), "rm": str(out / "rm"), "rl": str(out / "rl")}
    for stage in ("sft", "rm", "rl"):
        assert (out / stage / "metrics.jsonl").is_file(), stage
        assert (out / stage / "config.json").is_file(), stage

    rm = [json.loads(x) for x in (out / "rm" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rm] == list(range(8))
    assert rm[0]["initial/test/pref_accuracy"] == summary["rm_accuracy_before"]
    assert rm[-1]["test/pref_accuracy"] == summary["rm_accuracy_after"]
    # The reward model learns its verdicts (the loss of the "A"/"B" answer falls).
    assert sum(x["loss"] for x in rm[-3:]) < 0.7 * sum(x["loss"] for x in rm[:3])

    rl = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rl] == [0, 1, 2]
    # Training rewards are tournament win rates; the evaluation is against the reference reply.
    assert all(0.0 <= x["env/reward/mean"] <= 1.0 for x in rl)
    assert "test/reward/mean" in rl[1]
    assert "test/reward/mean" in rl[2]
    assert rl[-1]["test/reward/mean"] == summary["rm_reward_after"]
    assert "test/vs_reference/reward/mean" in rl[-1]
    config = json.loads((out / "rl" / "config.json").read_text())
    assert config["dataset"]["rm_sampler_path"] == summary["rm_sampler_path"]


def test_bad_config_names_the_flag() -> None:
    with pytest.raises(ValueError, match=r"RLHFRecipe\.group_size \(--group-size\) must be >= 2"):
        RLHFRecipe(group_size=1)
    with pytest.raises(ValueError, match=r"RLHFRecipe\.rm\.steps \(--rm\.steps\) must be > 0, got 0"):
        RLHFRecipe(rm=preference_stage(0, 8, 20))
    with pytest.raises(ValueError, match=r"RLHFRecipe\.kl_coef \(--kl-coef\) must be >= 0"):
        RLHFRecipe(kl_coef=-0.1)


class _PrefersLonger:
    """A comparison-level preference model: the longer last reply wins."""

    async def __call__(self, comparison: Comparison, /) -> float:
        a, b = len(comparison.completion_A[-1]["content"]), len(comparison.completion_B[-1]["content"])
        return 1.0 if a > b else 0.0 if a < b else 0.5


def test_comparison_judge_adapts_the_preference_model() -> None:
    judge = ComparisonJudge(_PrefersLonger())
    assert isinstance(judge, EnvPreferenceModel)
    prompt: list[Message] = [{"role": "user", "content": "hi"}]
    long: list[Message] = [{"role": "assistant", "content": "hello there"}]
    short: list[Message] = [{"role": "assistant", "content": "yo"}]
    assert asyncio.run(judge(prompt, long, short)) == 1.0
    assert asyncio.run(judge(prompt, short, long)) == 0.0


@attrs.frozen
class _Group(EnvGroupBuilder):
    index: int

    async def make_envs(self) -> Sequence[Env]:
        return []


def test_prompt_groups_batches_in_order() -> None:
    builders = [_Group(i) for i in range(5)]
    ds = PromptGroups(builders, batch_size=2)
    assert len(ds) == 2
    assert list(ds.get_batch(1)) == list(builders[2:4])


def test_reward_model_prompts_is_a_picklable_config() -> None:
    task = RewardModelPrompts(
        data=ComparisonData(test_size=12), rm_sampler_path="tempering://run-x/sampler_weights/final"
    )
    again = pickle.loads(pickle.dumps(task))
    assert again == task
    assert again.service is None


def test_rlhf_eval_seeds_and_base(tmp_path: Path) -> None:
    """``--eval-seeds 2 --eval-base``: the held-out reward over two sampling seeds (mean and sd)
    before and after RL, and the untrained model measured too."""
    out = tmp_path / "run"
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    small = tmp_path / "chat_test_8.jsonl"
    small.write_text("".join(assets.path("arithmetic_chat_test.jsonl").read_text().splitlines(True)[:8]))
    flags = (
        "--sft-steps 2 --sft-batch-size 4 --sft-eval-every 0 --rm-steps 2 --rm-batch-size 2 "
        "--rm-eval-every 0 --test-pairs 4 --rl-steps 1 --rl-prompts 2 --group-size 2 --eval-every 0 "
        "--eval-samples 2 --max-tokens 6 --show 1 --no-progress --eval-seeds 2 --eval-base"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "rlhf", *flags.split(),
         "--sft-test-path", str(small), "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    for when in ("base", "before", "after"):
        assert 0.0 <= summary[f"rm_reward_{when}"] <= 1.0, when
        assert summary[f"rm_reward_{when}_sd"] >= 0.0, when
    assert 0.0 <= summary["answer_accuracy_base"] <= 1.0
    assert summary["reply_chars_base"] >= 0
    with pytest.raises(ValueError, match=r"eval_seeds \(--eval-seeds\) must be > 0"):
        RLHFRecipe(eval_seeds=0)
