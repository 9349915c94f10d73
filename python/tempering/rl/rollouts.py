"""Rollouts: play the ``G`` envs of a group with a policy, robustly, and score the group.

Shapes (docs/notation.md): ``P`` groups of a batch, ``G`` members of a group, ``T`` tokens.

=====================  =============================================================================
what                   how
=====================  =============================================================================
concurrency            every env and sampling call is async; sampling requests are bounded by a
                       semaphore (``RolloutConfig.max_concurrent_samples``)
shared first turn      when every member starts from the same observation and stop condition, the
                       first turn is one request with ``num_samples = G`` (policies that implement
                       :class:`~tempering.rl.policy.GroupTokenCompleter`)
timeouts, retries      ``rollout_timeout_s`` (default 600 s) bounds one member's episode, and each of
                       the group's ``make_envs``, ``compute_group_rewards`` and ``cleanup``; a
                       failed member is replayed on a fresh env (``max_retries``) when the group's
                       envs are independent
viable groups          a group is kept when at least ``min_group_fraction`` of its members finished
limits                 turns (default 64), sampled tokens, prompt plus sampled tokens, tool calls,
                       wall time per rollout and per sampling call; what a limit does, the
                       termination-reward clamp, fail-fast, presets and hooks:
                       :mod:`tempering.rl.rollout_policy` (the end reason says which limit)
failures               an env that raises, returns a reward that is not a finite number, or makes
                       no envs fails its rollout, never the run; failures are counted by exception
                       type (``rollout/failed/<Type>``) and each distinct message is logged once at
                       WARNING; ``cleanup()`` always runs. A training step whose every group failed
                       stops the run (:func:`raise_if_every_rollout_failed`)
masking                an env masks a turn (no gradient) by setting ``StepResult.metrics[MASK_TURN]``
                       (or the cookbook's ``metrics["parse_error_masked"]``) to 1
coordinated groups     a builder with ``coordinated_envs = True`` (e.g. the players of one game,
                       who wait for each other) has its members played concurrently from the start
                       and never retried one by one
seeding                with ``seed`` (the group's) and a :class:`~tempering.rl.policy.SeedableTokenCompleter`,
                       every request gets its own seed: ``sampling_seed(seed, "first")`` for the
                       shared first turn, ``sampling_seed(seed, "member", g, attempt, turn)``
                       otherwise; samples then repeat whatever order requests complete in
=====================  =============================================================================

Example::

    config = RolloutConfig(rollout_timeout_s=60, max_retries=1, min_group_fraction=0.5)
    rollouts_P = await rollout_batch(builders_P, policy, config)
    groups_P = [r.group for r in rollouts_P if r.group is not None]
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from typing import TypeVar

import attrs

from tempering.rl.episodes import Clock, FirstTurn, RolloutLimits, play_member, seeded, with_timeout
from tempering.rl.executors import RolloutExecutor
from tempering.rl.policy import policy_version, sampling_seed
from tempering.rl.rollout_failures import (
    EmptyGroupError,
    FailureStats,
    RewardError,
    RolloutsFailedError,
    check_reward,
    raise_if_every_rollout_failed,
    warn_if_nothing_to_learn,
)
from tempering.rl.rollout_policy import (
    LIMIT_REASONS,
    EndReason,
    RolloutConfig,
    RolloutFailFastError,
    clamped_final_reward,
)
from tempering_protocols import Env, EnvGroupBuilder, TokenCompleter, Trajectory, TrajectoryGroup
from tempering_protocols.rl import MASK_TURN

__all__ = [
    "MASK_TURN",
    "EmptyGroupError",
    "EndReason",
    "GroupRollout",
    "RewardError",
    "RolloutConfig",
    "RolloutFailFastError",
    "RolloutLimits",
    "RolloutsFailedError",
    "raise_if_every_rollout_failed",
    "rollout_batch",
    "rollout_group",
    "warn_if_nothing_to_learn",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


@attrs.frozen
class GroupRollout:
    """The outcome of one group's rollouts.

    ``group`` is ``None`` when too few members finished (``n_failed`` say how many did not).
    ``end_reasons_G`` and ``stop_reasons`` describe the finished members; ``version`` is the
    policy version (training step of the sampler's weights) the group was sampled with; ``seed``
    the group's sampling seed (``None``: unseeded).
    """

    index: int
    group: TrajectoryGroup | None
    tags: Sequence[str]
    version: int
    n_members: int
    n_failed: int
    failures: dict[str, int]
    end_reasons_G: Sequence[EndReason]
    sampling_s: float
    env_s: float
    n_sample_requests: int
    builder: EnvGroupBuilder | None = attrs.field(default=None, eq=False)
    """The builder (kept so a stale group can be resampled)."""
    seed: int | None = None
    first_error: BaseException | None = attrs.field(default=None, eq=False)
    """The group's first failure (``None``: none)."""


async def rollout_group(
    builder: EnvGroupBuilder,
    policy: TokenCompleter,
    config: RolloutConfig,
    *,
    limits: RolloutLimits | None = None,
    executor: RolloutExecutor | None = None,
    index: int = 0,
    seed: int | None = None,
) -> GroupRollout:
    """Play one group: make its envs, play every member, score the finished ones, clean up.

    Never raises for a failing env (``make_envs``, ``initial_observation``, ``step``,
    ``compute_group_rewards`` or a timeout): the failure is counted in ``failures``. Raises only
    on cancellation. ``seed``: the group's sampling seed, from which every request's derives
    (see the module docstring); ``None``: unseeded.

    Example::

        rollout = await rollout_group(builder, policy, RolloutConfig(), seed=sampling_seed(0, 7))
        rollout.group.get_total_rewards()
    """
    limits = limits if limits is not None else RolloutLimits.from_config(config)
    stats = FailureStats(index=index, warned=limits.warned)
    clock = Clock(stats, limits)
    version = policy_version(policy)
    placed = executor.place(builder) if executor is not None else builder
    coordinated = bool(getattr(builder, "coordinated_envs", False))
    group: TrajectoryGroup | None = None
    end_reasons: list[EndReason] = []
    n_members = 0
    n_failed = 0
    tags: list[str] = []
    try:
        try:
            tags = list(placed.logging_tags())
            envs_G = list(await with_timeout(clock.env(placed.make_envs()), config.rollout_timeout_s))
            if not envs_G:
                raise EmptyGroupError(f"make_envs of {type(builder).__name__} returned no envs")
        except Exception as exc:  # the env's failure, counted
            stats.fail(exc, "make_envs")
            if config.failure == "fail_fast":
                raise RolloutFailFastError(f"make_envs of {type(builder).__name__} failed: {exc!r}") from exc
            envs_G = []
        n_members = len(envs_G)
        batcher = (
            None
            if coordinated or n_members < 2
            else FirstTurn(n_members, seeded(policy, seed, "first"), clock, config.share_first_turn)
        )

        async def member(g: int, env: Env) -> tuple[Trajectory, Env, EndReason] | None:
            attempt = 0
            first = (batcher, g) if batcher is not None else None
            while True:

                def policy_at(turn: int, attempt: int = attempt) -> TokenCompleter:
                    return seeded(policy, seed, "member", g, attempt, turn)

                try:
                    traj, reason = await play_member(env, policy_at, config, clock, first, g)
                    return traj, env, reason
                except Exception as exc:  # the env's failure (a limit, a timeout, a hook), counted
                    stats.fail(exc, f"the rollout of member {g}")
                    if config.failure == "fail_fast":
                        raise RolloutFailFastError(f"the rollout of member {g} failed: {exc!r}") from exc
                    if coordinated or attempt >= config.max_retries:
                        return None
                attempt += 1
                first = None
                try:
                    fresh = await with_timeout(clock.env(placed.make_envs()), config.rollout_timeout_s)
                    env = list(fresh)[g]
                except Exception as exc:
                    stats.fail(exc, f"make_envs (retry of member {g})")
                    return None

        tasks = [asyncio.ensure_future(member(g, env)) for g, env in enumerate(envs_G)]
        try:
            results = await asyncio.gather(*tasks)
        except RolloutFailFastError:
            for task in tasks:
                task.cancel()
            raise
        finished = [r for r in results if r is not None]
        n_failed = n_members - len(finished)
        needed = max(1, math.ceil(config.min_group_fraction * n_members))
        if n_members and len(finished) >= needed:
            trajectories_G = [t for t, _, _ in finished]
            try:
                scored = await with_timeout(
                    clock.env(placed.compute_group_rewards(trajectories_G, [e for _, e, _ in finished])),
                    config.rollout_timeout_s,
                )
                where = f"{type(builder).__name__}.compute_group_rewards"
                end_reasons = [r for _, _, r in finished]
                finals = [check_reward(r, where) for r, _ in scored]
                if config.limit_reward == "clamp":
                    finals = [
                        clamped_final_reward(t, f) if why in LIMIT_REASONS else f
                        for t, f, why in zip(trajectories_G, finals, end_reasons, strict=True)
                    ]
                group = TrajectoryGroup(
                    trajectories_G=trajectories_G, final_rewards_G=finals, metrics_G=[m for _, m in scored]
                )
            except Exception as exc:
                end_reasons = []
                stats.fail(exc, "compute_group_rewards")
                if config.failure == "fail_fast":
                    raise RolloutFailFastError(f"compute_group_rewards failed: {exc!r}") from exc
    finally:
        try:
            await with_timeout(placed.cleanup(), config.rollout_timeout_s)
        except Exception as exc:
            stats.fail(exc, "cleanup")
    return GroupRollout(
        index=index,
        group=group,
        tags=tags,
        version=version,
        n_members=n_members,
        n_failed=n_failed,
        failures=dict(stats.failures),
        end_reasons_G=end_reasons,
        sampling_s=stats.sampling_s,
        env_s=stats.env_s,
        n_sample_requests=stats.n_sample_requests,
        builder=builder,
        seed=seed,
        first_error=stats.first_error,
    )


async def rollout_batch(
    builders_P: Sequence[EnvGroupBuilder],
    policy: TokenCompleter,
    config: RolloutConfig,
    *,
    limits: RolloutLimits | None = None,
    executor: RolloutExecutor | None = None,
    seed: int | None = None,
) -> list[GroupRollout]:
    """Roll out every group of a batch concurrently; results in builder order. ``seed``: the
    batch's sampling seed; group ``p`` is seeded with ``sampling_seed(seed, "group", p)``.

    Example::

        rollouts_P = await rollout_batch(dataset.get_batch(0), policy, RolloutConfig())
    """
    limits = limits if limits is not None else RolloutLimits.from_config(config)
    return list(
        await asyncio.gather(
            *(
                rollout_group(
                    b,
                    policy,
                    config,
                    limits=limits,
                    executor=executor,
                    index=p,
                    seed=None if seed is None else sampling_seed(seed, "group", p),
                )
                for p, b in enumerate(builders_P)
            )
        )
    )
