"""BatchPolicy: dynamic sampling refills zero-variance groups within the budget, overlong
trajectories are filtered or shaped, the step's batch/… metrics count the waste, bad options are
refused, and a short RL run on the tiny model logs them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest
import tinker

from tempering.envs.tasks import LowercaseTask
from tempering.local import ServiceClient
from tempering.rl.batch_policy import (
    BatchPolicy,
    BatchShaper,
    is_zero_variance,
    refill_builder,
    shape_overlong,
)
from tempering.rl.data import trajectories_to_datums
from tempering.rl.rollouts import GroupRollout
from tempering.rl.train import RLConfig, train
from tempering.training import AdamConfig, LRSchedule, RunConfig
from tempering_protocols import EnvGroupBuilder, TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition


def _traj(reward: float, n_tokens: int = 2, stop: str = "stop") -> Trajectory:
    ac = TokensWithLogprobs(tokens=[5] * n_tokens, maybe_logprobs=[-0.5] * n_tokens, stop_reason=stop)  # pyright: ignore[reportArgumentType]
    tr = Transition(ob=tinker.ModelInput.from_ints([1, 2]), ac=ac, reward=reward, episode_done=True)
    return Trajectory(transitions=[tr], final_ob=tinker.ModelInput.empty())


def _rollout(index: int, rewards: Sequence[float]) -> GroupRollout:
    group = TrajectoryGroup(
        trajectories_G=[_traj(r) for r in rewards],
        final_rewards_G=[0.0] * len(rewards),
        metrics_G=[{} for _ in rewards],
    )
    return GroupRollout(
        index=index, group=group, tags=[], version=0, n_members=len(rewards), n_failed=0,
        failures={}, end_reasons_G=["done"] * len(rewards), sampling_s=0.0, env_s=0.0, n_sample_requests=1,
    )  # fmt: skip


async def _ready(r: GroupRollout) -> GroupRollout:
    return r


def _collect(
    shaper: BatchShaper, first: list[GroupRollout], refills: list[list[float]]
) -> list[GroupRollout]:
    calls: list[int] = []

    async def refill(k: int) -> GroupRollout:
        calls.append(k)
        return _rollout(100 + k, refills[k])

    async def run() -> list[GroupRollout]:
        return [r async for r in shaper.source([_ready(r) for r in first], refill)]

    out = asyncio.run(run())
    assert calls == list(range(len(calls)))  # refills asked for in order, each once
    return out


def test_zero_variance_groups_are_refilled_in_rounds_until_none_is_owed() -> None:
    shaper = BatchShaper(BatchPolicy(dynamic_sampling=True, refill_budget=1.0), max_tokens=8)
    first = [_rollout(0, [1, 1]), _rollout(1, [0, 1]), _rollout(2, [0, 0])]
    # Round 1 refills the two zero-variance groups; one refill is itself constant: round 2.
    out = _collect(shaper, first, [[1, 1], [0, 1], [1, 0]])
    assert [r.index for r in out] == [0, 1, 2, 100, 101, 102]
    metrics = shaper.step_metrics(out)
    assert metrics["batch/refill_groups"] == 3.0
    assert metrics["batch/zero_variance_groups"] == 3.0  # two first, one refill: all logged
    assert metrics["batch/zero_variance_samples"] == 6.0
    assert shaper.step_metrics([])["batch/refill_groups"] == 0.0  # counters reset per step


def test_the_budget_caps_the_refills() -> None:
    shaper = BatchShaper(BatchPolicy(dynamic_sampling=True, refill_budget=0.25), max_tokens=8)
    first = [_rollout(i, [1, 1]) for i in range(4)]  # all constant, budget ceil(0.25 * 4) = 1
    out = _collect(shaper, first, [[1, 1]] * 4)
    assert len(out) == 5
    assert shaper.step_metrics(out)["batch/refill_groups"] == 1.0


def test_without_dynamic_sampling_nothing_is_refilled() -> None:
    assert BatchPolicy().refill_limit(8) == 0
    assert BatchPolicy(dynamic_sampling=True, refill_budget=0.5).refill_limit(5) == 3


def test_refill_builders_come_from_the_following_batches() -> None:
    batches = {i: [f"b{i}g{j}" for j in range(2)] for i in range(10)}

    def batch(i: int) -> Sequence[EnvGroupBuilder]:
        return batches[i % 10]  # pyright: ignore[reportReturnType]

    assert [refill_builder(batch, 3, k) for k in range(5)] == ["b4g0", "b4g1", "b5g0", "b5g1", "b6g0"]  # pyright: ignore[reportUnknownMemberType]
    assert refill_builder(batch, 9, 0) == "b0g0"  # pyright: ignore[reportUnknownMemberType]


def test_is_zero_variance_counts_final_rewards_and_ignores_singletons() -> None:
    assert is_zero_variance(_rollout(0, [1, 1]))
    assert not is_zero_variance(_rollout(0, [1]))
    r = _rollout(0, [1, 1])
    assert r.group is not None
    varied = attrs.evolve(r, group=attrs.evolve(r.group, final_rewards_G=[0.0, 1.0]))
    assert not is_zero_variance(varied)


def _group(*trajs: Trajectory) -> TrajectoryGroup:
    return TrajectoryGroup(
        trajectories_G=list(trajs), final_rewards_G=[0.0] * len(trajs), metrics_G=[{}] * len(trajs)
    )


def test_overlong_filter_masks_a_truncated_trajectory() -> None:
    group = _group(_traj(1.0, 8, "length"), _traj(0.0, 3))
    (kept,), n = shape_overlong([group], BatchPolicy(overlong="filter"), max_tokens=8)
    assert n == 1
    assert [t.transitions[0].masked for t in kept.trajectories_G] == [True, False]
    data, _ = trajectories_to_datums([kept], [[0.5, -0.5]])
    assert [float(d.loss_fn_inputs["mask"].to_numpy().sum()) for d in data] == [0.0, 3.0]
    (same,), n = shape_overlong([group], BatchPolicy(), max_tokens=8)
    assert n == 1
    assert same is group  # keep: untouched, still counted


def test_overlong_shape_ramps_the_penalty_over_the_window() -> None:
    group = _group(_traj(1.0, 4), _traj(1.0, 6), _traj(1.0, 8, "length"))
    policy = BatchPolicy(overlong="shape", overlong_window=4, overlong_penalty=0.5)
    (shaped,), n = shape_overlong([group], policy, max_tokens=8)
    assert n == 1
    # window (4, 8]: 4 tokens -> 0, 6 -> half the penalty, 8 -> all of it.
    assert shaped.final_rewards_G == [0.0, -0.25, -0.5]
    assert shaped.get_total_rewards() == [1.0, 0.75, 0.5]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"refill_budget": -1.0}, "refill_budget"),
        ({"overlong": "drop"}, "overlong must be"),
        ({"overlong_window": 0}, "overlong_window"),
        ({"overlong_penalty": float("nan")}, "overlong_penalty"),
    ],
)
def test_bad_options_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BatchPolicy(**kw)  # pyright: ignore[reportArgumentType]


def test_dynamic_sampling_is_refused_with_the_async_schedule(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dynamic_sampling runs with the sync and streaming schedules"):
        RLConfig(
            run=RunConfig(log_dir=str(tmp_path)),
            dataset=LowercaseTask(),
            schedule="async",
            batch=BatchPolicy(dynamic_sampling=True),
        )


@pytest.mark.timeout(300)
def test_a_tiny_run_refills_and_logs_the_batch_metrics(service: ServiceClient, tmp_path: Path) -> None:
    config = RLConfig(
        run=RunConfig(log_dir=str(tmp_path), save_every=0, eval_every=0, progress=False),
        dataset=LowercaseTask(batch_size=2, group_size=4),
        adam=AdamConfig(learning_rate=1e-3, schedule=LRSchedule("constant")),
        num_steps=2,
        max_tokens=4,
        batch=BatchPolicy(dynamic_sampling=True, refill_budget=1.0, overlong="filter"),
    )
    metrics = asyncio.run(train(config, service=service)).metrics
    assert len(metrics) == 2
    for m in metrics:
        assert m["batch/refill_groups"] <= 2.0  # ceil(1.0 * 2)
        # Every zero-variance group of the first two is refilled while the budget lasts.
        assert m["batch/zero_variance_groups"] <= 2.0 + m["batch/refill_groups"]
        assert m["batch/overlong"] >= 0.0
    assert any(m["batch/overlong"] > 0 for m in metrics)  # 4 tokens: most replies are cut
