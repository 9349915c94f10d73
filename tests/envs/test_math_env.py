"""The math env: correctness from MathGrader, a format reward for ``\\boxed{}``, grader failures
as a zero reward counted in the metrics, and the dataset builder over local copies."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import pytest

from tempering.data.hub import MathProblem
from tempering.envs.math import MathDataset, MathGroupBuilder, MathRewards, MathTask
from tempering.grading import MathGrader
from tempering.renderers import BaseRenderer
from tempering_protocols.testing import check_env_group_builder, check_rl_dataset_builder

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "hub_fixtures"
PROBLEM = MathProblem("Tom has 3 bags of 4 pens. How many pens in all?", "12", "test: row 1")


def _say(renderer: BaseRenderer, text: str) -> list[int]:
    stop = renderer.get_stop_sequences()[0]
    assert isinstance(stop, int)
    return [*renderer.tokenizer.encode(text, add_special_tokens=False), stop]


def _rewards(renderer: BaseRenderer, text: str, rewards: MathRewards, *, stop: bool = True) -> list[float]:
    builder = MathGroupBuilder(PROBLEM, renderer, rewards, group_size=2)
    tokens = _say(renderer, text) if stop else list(renderer.tokenizer.encode(text, add_special_tokens=False))
    group = check_env_group_builder(builder, actions=lambda ob, s: tokens)
    return group.get_total_rewards()


@pytest.mark.timeout(120)
def test_rewards_weigh_correctness_and_format(renderer: BaseRenderer) -> None:
    rewards = MathRewards(MathGrader(timeout_s=None), correct_weight=1.0, format_weight=0.25)
    assert _rewards(renderer, "3 * 4 = 12\n\\boxed{12}", rewards) == [1.0, 1.0]
    assert _rewards(renderer, "3 * 4 = 12", rewards) == [0.75, 0.75]  # right, not boxed
    assert _rewards(renderer, "\\boxed{13}", rewards) == [0.0, 0.0]  # boxed, wrong
    assert _rewards(renderer, "13", rewards) == [-0.25, -0.25]
    # No stop sequence: the reply did not parse, so it is not well formatted either.
    assert _rewards(renderer, "\\boxed{12}", rewards, stop=False) == [0.75, 0.75]
    weighted = MathRewards(MathGrader(timeout_s=None), correct_weight=2.0, format_weight=0.0)
    assert _rewards(renderer, "the answer is 12", weighted) == [2.0, 2.0]


@pytest.mark.timeout(120)
def test_grader_timeouts_and_errors_are_zero_reward_and_counted(renderer: BaseRenderer) -> None:
    # A symbolic answer goes to a math-verify worker process; 1 ms is never enough for it.
    slow = MathRewards(MathGrader(timeout_s=0.001), format_weight=0.0)
    builder = MathGroupBuilder(MathProblem("Expand.", "x^2 + 2x + 1", "t"), renderer, slow, group_size=2)
    group = check_env_group_builder(builder, actions=lambda ob, s: _say(renderer, "\\boxed{(x+1)^2}"))
    assert group.get_total_rewards() == [0.0, 0.0]
    metrics = group.trajectories_G[0].transitions[0].metrics
    assert metrics["grader/timeouts"] == 1.0
    assert metrics["correct"] == 0.0
    assert slow.grader.metrics()["grader/timeouts"] == 2.0
    # An answer over the grader's length limit is an error: reward 0, counted, no crash.
    short = MathRewards(MathGrader(timeout_s=None, max_answer_chars=3), format_weight=0.0)
    reward, metrics = asyncio.run(short.score("\\boxed{12345}", True, "12345"))
    assert (reward, metrics["grader/errors"], metrics["format"]) == (0.0, 1.0, 1.0)


def test_dataset_batches_are_deterministic_groups(renderer: BaseRenderer) -> None:
    problems = [MathProblem(f"What is {i} + 1?", str(i + 1), f"row {i}") for i in range(10)]
    ds = MathDataset(problems, renderer, MathRewards(), batch_size=4, group_size=3, seed=5)
    assert len(ds) == 2
    first = [b.problem for b in ds.get_batch(0)]  # pyright: ignore[reportAttributeAccessIssue]
    assert first == [b.problem for b in ds.get_batch(0)]  # pyright: ignore[reportAttributeAccessIssue]
    assert len(set(first)) == 4
    assert pickle.loads(pickle.dumps(ds.get_batch(1)[0])).problem in problems  # pyright: ignore[reportAttributeAccessIssue]


@pytest.mark.timeout(120)
def test_task_builds_from_local_copies_and_conforms() -> None:
    task = MathTask(
        dataset="gsm8k",
        source=str(FIXTURES / "gsm8k"),
        test_source=str(FIXTURES / "gsm8k"),
        batch_size=2,
        group_size=2,
        grader_timeout_s=2.0,
    )
    train, test = asyncio.run(task())
    assert test is not None
    assert len(test.get_batch(0)) == 2  # the fixture's test split, in one batch
    check_rl_dataset_builder(task)
    # A dataset without a test split and no test source has no held-out set.
    polaris = MathTask(dataset="polaris", source=str(FIXTURES / "polaris"))
    assert polaris.test_problems() is None
    assert MathTask(
        dataset="math", test_dataset="math500", test_source=str(FIXTURES / "math500")
    ).test_problems()
    del train


def test_task_refuses_an_unknown_dataset() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'gsm9k'; known: gsm8k"):
        MathTask(dataset="gsm9k")
