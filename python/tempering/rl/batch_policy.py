"""What a step does with its sampled groups before training: dynamic sampling (refill groups of
zero reward variance within a budget) and overlong filtering or shaping. ``RLConfig.batch``.

Shapes (docs/notation.md): ``P`` groups of a step, ``G`` members of a group.

=====================  =============================================================================
option                 what it does
=====================  =============================================================================
``dynamic_sampling``   after a step's ``P`` groups are sampled, each group whose members all got
                       the same reward (zero variance: no advantage, nothing learned) is replaced
                       by a freshly sampled group, in rounds, until none is left or
                       ``refill_budget * P`` extra groups were sampled (``sync`` and ``streaming``
                       schedules). Refill groups come from the following batches of the train
                       dataset (batch ``step + 1``, ``step + 2``, …, wrapping), each seeded with
                       ``sampling_seed(seed, "refill", step, k)``, so a run and its resume repeat
                       them. The zero-variance groups are still logged and dropped as before
``overlong``           ``keep`` (default); ``filter``: a trajectory whose last turn stopped at
                       ``max_tokens`` (``stop_reason == "length"``) is masked (trains on nothing);
                       ``shape``: every trajectory's reward gets DAPO's soft overlong penalty,
                       by the sampled tokens of its last turn: 0 up to ``max_tokens -
                       overlong_window``, then falling linearly to ``-overlong_penalty`` at
                       ``max_tokens``
=====================  =============================================================================

Metrics (every step, whether the options are on or not): ``batch/zero_variance_groups`` and
``batch/zero_variance_samples`` (members sampled in groups that teach nothing: the waste dynamic
sampling recovers), ``batch/refill_groups`` (extra groups sampled), ``batch/overlong`` (trajectories
that hit ``max_tokens``).

Example::

    RLConfig(..., batch=BatchPolicy(dynamic_sampling=True, refill_budget=1.0, overlong="shape",
                                    overlong_window=16))
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Literal, TypeAlias

import attrs

from tempering.rl.episodes import RolloutLimits
from tempering.rl.executors import RolloutExecutor
from tempering.rl.policy import sampling_seed
from tempering.rl.rollout_policy import RolloutConfig
from tempering.rl.rollouts import GroupRollout, rollout_group
from tempering_protocols import EnvGroupBuilder, TokenCompleter, Trajectory, TrajectoryGroup

__all__ = [
    "BatchPolicy",
    "BatchShaper",
    "is_zero_variance",
    "refill_rollouts",
    "refill_zero_variance",
    "shape_overlong",
    "zero_variance_metrics",
]

Overlong: TypeAlias = Literal["keep", "filter", "shape"]


@attrs.frozen
class BatchPolicy:
    """Dynamic sampling and overlong handling (see the module docstring).

    Example::

        BatchPolicy(dynamic_sampling=True, refill_budget=0.5)
    """

    dynamic_sampling: bool = False
    """Replace zero-variance groups by freshly sampled ones, within ``refill_budget``."""
    refill_budget: float = 1.0
    """Extra groups a step may sample, as a fraction of its ``P`` groups (rounded up)."""
    overlong: Overlong = "keep"
    """What a trajectory whose last turn hit ``max_tokens`` gets: ``keep``, ``filter`` or ``shape``."""
    overlong_window: int = 16
    """With ``shape``: the tokens before ``max_tokens`` over which the penalty ramps up."""
    overlong_penalty: float = 1.0
    """With ``shape``: the penalty at ``max_tokens`` (subtracted from the reward)."""

    def __attrs_post_init__(self) -> None:
        if not (math.isfinite(self.refill_budget) and self.refill_budget >= 0):
            raise ValueError(
                f"BatchPolicy.refill_budget must be a finite number >= 0, got {self.refill_budget}"
            )
        if self.overlong not in ("keep", "filter", "shape"):
            raise ValueError(
                f"BatchPolicy.overlong must be 'keep', 'filter' or 'shape', got {self.overlong!r}"
            )
        if self.overlong_window < 1:
            raise ValueError(f"BatchPolicy.overlong_window must be >= 1, got {self.overlong_window}")
        if not (math.isfinite(self.overlong_penalty) and self.overlong_penalty >= 0):
            raise ValueError(
                f"BatchPolicy.overlong_penalty must be a finite number >= 0, got {self.overlong_penalty}"
            )

    def check_schedule(self, schedule: str) -> None:
        """Dynamic sampling refills a step's own groups: not with the ``async`` schedule."""
        if self.dynamic_sampling and schedule == "async":
            raise ValueError(
                "BatchPolicy.dynamic_sampling runs with the sync and streaming schedules, not async"
            )

    def refill_limit(self, n_groups: int) -> int:
        """The most extra groups a step of ``n_groups`` may sample."""
        return math.ceil(self.refill_budget * n_groups) if self.dynamic_sampling else 0


def is_zero_variance(rollout: GroupRollout) -> bool:
    """A finished group of two or more members whose total rewards are all equal."""
    if rollout.group is None:
        return False
    totals = rollout.group.get_total_rewards()
    return len(totals) > 1 and max(totals) == min(totals)


def zero_variance_metrics(rollouts: Sequence[GroupRollout], n_refill: int) -> dict[str, float]:
    """``batch/zero_variance_groups``, ``batch/zero_variance_samples`` and ``batch/refill_groups``."""
    wasted = [r for r in rollouts if is_zero_variance(r)]
    return {
        "batch/zero_variance_groups": float(len(wasted)),
        "batch/zero_variance_samples": float(sum(r.n_members for r in wasted)),
        "batch/refill_groups": float(n_refill),
    }


async def refill_zero_variance(
    first: Sequence[Awaitable[GroupRollout]],
    refill: Callable[[int], Awaitable[GroupRollout]],
    limit: int,
    counted: list[int] | None = None,
) -> AsyncIterator[GroupRollout]:
    """The step's rollouts, then its refill rollouts (a ``sync`` schedule's source).

    ``first``: the step's ``P`` rollouts; ``refill(k)``: the ``k``-th refill rollout (its own
    builder and seed). In each round, one refill per zero-variance group still unreplaced, until
    none is left or ``limit`` refills were sampled. The zero-variance rollouts are yielded too
    (for the metrics; the step drops them). ``counted``: the number of refills is appended to it.

    Example::

        async for rollout in refill_zero_variance(tasks, lambda k: rollout_group(...), 8): ...
    """
    rollouts = list(await asyncio.gather(*first))
    owed = sum(is_zero_variance(r) for r in rollouts)
    k = 0
    while owed and k < limit:
        n = min(owed, limit - k)
        fresh = await asyncio.gather(*(refill(k + i) for i in range(n)))
        k += n
        rollouts += fresh
        owed = owed - n + sum(is_zero_variance(r) for r in fresh)
    if counted is not None:
        counted.append(k)
    for rollout in rollouts:
        yield rollout


def _overlong(trajectory: Trajectory) -> bool:
    return bool(trajectory.transitions) and trajectory.transitions[-1].ac.stop_reason == "length"


def shape_overlong(
    groups: Sequence[TrajectoryGroup], policy: BatchPolicy, max_tokens: int
) -> tuple[list[TrajectoryGroup], int]:
    """``groups`` with overlong trajectories filtered (masked) or shaped (penalised), and how many
    trajectories were overlong. ``keep`` returns the groups as they are.

    Example::

        groups, n_overlong = shape_overlong(groups, BatchPolicy(overlong="filter"), max_tokens=64)
    """
    n = sum(_overlong(t) for g in groups for t in g.trajectories_G)
    if policy.overlong == "keep" or (policy.overlong == "filter" and n == 0):
        return list(groups), n
    out: list[TrajectoryGroup] = []
    for g in groups:
        trajs = list(g.trajectories_G)
        finals = list(g.final_rewards_G)
        for m, t in enumerate(trajs):
            if policy.overlong == "filter" and _overlong(t):
                trajs[m] = attrs.evolve(t, transitions=[attrs.evolve(x, masked=True) for x in t.transitions])
            elif policy.overlong == "shape" and t.transitions:
                length = len(t.transitions[-1].ac.tokens)
                start = max_tokens - policy.overlong_window
                ramp = min(1.0, max(0.0, (length - start) / policy.overlong_window))
                finals[m] -= policy.overlong_penalty * ramp
        out.append(attrs.evolve(g, trajectories_G=trajs, final_rewards_G=finals))
    return out, n


def refill_builder(batch: Callable[[int], Sequence[EnvGroupBuilder]], step: int, k: int) -> EnvGroupBuilder:
    """The ``k``-th refill group's builder of step ``step``: the builders of batches ``step + 1``,
    ``step + 2``, … in order (``batch(i)`` wraps around the dataset)."""
    i = step + 1
    while True:
        builders = batch(i)
        if k < len(builders):
            return builders[k]
        k -= len(builders)
        i += 1


def refill_rollouts(
    batch: Callable[[int], Sequence[EnvGroupBuilder]],
    step: int,
    n_groups: int,
    policy: TokenCompleter,
    rollout: RolloutConfig,
    *,
    limits: RolloutLimits,
    executor: RolloutExecutor,
    seed: int | None,
) -> Callable[[int], Awaitable[GroupRollout]]:
    """``refill(k)``: the ``k``-th refill rollout of step ``step`` (:func:`refill_builder`'s
    builder, index ``n_groups + k``, seed ``sampling_seed(seed, "refill", step, k)``)."""

    def refill(k: int) -> Awaitable[GroupRollout]:
        return rollout_group(
            refill_builder(batch, step, k),
            policy,
            rollout,
            limits=limits,
            executor=executor,
            index=n_groups + k,
            seed=None if seed is None else sampling_seed(seed, "refill", step, k),
        )

    return refill


@attrs.define
class BatchShaper:
    """A run's :class:`BatchPolicy` at work: the step's rollout source, the groups shaped before
    training, and the step's ``batch/…`` metrics (counters reset by :meth:`step_metrics`)."""

    policy: BatchPolicy
    max_tokens: int
    refills: list[int] = attrs.field(factory=list[int])
    overlong: int = 0

    def source(
        self, tasks: Sequence[Awaitable[GroupRollout]], refill: Callable[[int], Awaitable[GroupRollout]]
    ) -> AsyncIterator[GroupRollout]:
        """The step's rollouts then its refills (dynamic sampling on)."""
        return refill_zero_variance(tasks, refill, self.policy.refill_limit(len(tasks)), self.refills)

    def shape(self, groups: Sequence[TrajectoryGroup]) -> list[TrajectoryGroup]:
        shaped, n = shape_overlong(groups, self.policy, self.max_tokens)
        self.overlong += n
        return shaped

    def step_metrics(self, used: Sequence[GroupRollout]) -> dict[str, float]:
        out = zero_variance_metrics(used, sum(self.refills)) | {"batch/overlong": float(self.overlong)}
        self.refills, self.overlong = [], 0
        return out
