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
budgets                ``max_turns`` (default 64) and ``max_trajectory_tokens`` end an episode early
                       (the trajectory is kept; its end reason says why)
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
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, TypeVar

import attrs

from tempering.rl.executors import RolloutExecutor
from tempering.rl.policy import GroupTokenCompleter, SeedableTokenCompleter, policy_version, sampling_seed
from tempering.rl.rollout_failures import (
    EmptyGroupError,
    FailureStats,
    RewardError,
    RolloutsFailedError,
    check_reward,
    raise_if_every_rollout_failed,
    warn_if_nothing_to_learn,
)
from tempering_protocols import (
    Env,
    EnvGroupBuilder,
    Observation,
    StopCondition,
    TokenCompleter,
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
)
from tempering_protocols.rl import MASK_TURN, PARSE_ERROR_MASKED

__all__ = [
    "MASK_TURN",
    "EmptyGroupError",
    "EndReason",
    "GroupRollout",
    "RewardError",
    "RolloutConfig",
    "RolloutLimits",
    "RolloutsFailedError",
    "raise_if_every_rollout_failed",
    "rollout_batch",
    "rollout_group",
    "warn_if_nothing_to_learn",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

EndReason = Literal["done", "max_turns", "token_budget"]


@attrs.frozen
class RolloutConfig:
    """How rollouts run. Every field has a safe default: an env that never ends its episode
    stops at ``max_turns`` (64) turns, and one that never answers fails after
    ``rollout_timeout_s`` (600 s); pass ``None`` to lift either limit.

    Example::

        RolloutConfig(max_concurrent_samples=64, rollout_timeout_s=120.0, max_retries=1,
                      min_group_fraction=0.75, max_turns=8, max_trajectory_tokens=4096)
    """

    max_concurrent_samples: int = 256
    """Sampling requests in flight at once (a group's shared first turn is one request)."""
    rollout_timeout_s: float | None = 600.0
    """Wall-clock limit of one member's episode (and of each of the group's ``make_envs``,
    ``compute_group_rewards`` and ``cleanup`` calls); ``None``: none."""
    max_retries: int = 0
    """Replays of a failed member on a fresh env (independent envs only)."""
    min_group_fraction: float = 1.0
    """Keep a group when at least this fraction of its members finished (at least one)."""
    max_turns: int | None = 64
    """End an episode after this many turns; ``None``: never."""
    max_trajectory_tokens: int | None = None
    """End an episode once its sampled tokens reach this many."""
    share_first_turn: bool = True
    """Sample a shared first observation once with ``num_samples = G``."""

    def __attrs_post_init__(self) -> None:
        if self.max_concurrent_samples < 1:
            raise ValueError(f"max_concurrent_samples must be >= 1, got {self.max_concurrent_samples}")
        if not 0.0 <= self.min_group_fraction <= 1.0:
            raise ValueError(f"min_group_fraction must be in [0, 1], got {self.min_group_fraction}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 (or None: no limit), got {self.max_turns}")
        timeout = self.rollout_timeout_s
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(
                f"rollout_timeout_s must be a finite number > 0 (or None: no limit), got {timeout}"
            )


@attrs.define
class RolloutLimits:
    """The semaphore that bounds sampling requests, shared by every rollout of a run, and the
    failure messages already logged (each distinct one is logged once at WARNING).

    Create it inside the running event loop.
    """

    samples: asyncio.Semaphore
    warned: set[str] = attrs.field(factory=set[str])

    @classmethod
    def from_config(cls, config: RolloutConfig) -> RolloutLimits:
        return cls(asyncio.Semaphore(config.max_concurrent_samples))


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


class _Clock:
    """Times awaited calls into the group's sampling and env totals."""

    def __init__(self, stats: FailureStats, limits: RolloutLimits) -> None:
        self.stats = stats
        self.limits = limits

    async def env(self, aw: Awaitable[_T]) -> _T:
        t0 = time.perf_counter()
        try:
            return await aw
        finally:
            self.stats.env_s += time.perf_counter() - t0

    async def sample(self, aw: Awaitable[_T]) -> _T:
        async with self.limits.samples:
            t0 = time.perf_counter()
            self.stats.n_sample_requests += 1
            try:
                return await aw
            finally:
                self.stats.sampling_s += time.perf_counter() - t0


class _FirstTurn:
    """Gathers the first observations of a group's members; when all are equal, samples them
    once with ``num_samples = G``. A member that fails before reporting withdraws."""

    def __init__(self, n: int, policy: TokenCompleter, clock: _Clock, enabled: bool) -> None:
        self._waiting = n
        self._policy = policy
        self._clock = clock
        self._enabled = enabled and isinstance(policy, GroupTokenCompleter)
        self._obs: dict[int, tuple[Observation, StopCondition]] = {}
        self._ready = asyncio.Event()
        self._shared: asyncio.Future[Sequence[TokensWithLogprobs]] | None = None
        self._slot: dict[int, int] = {}

    def withdraw(self) -> None:
        self._arrive()

    def _arrive(self) -> None:
        self._waiting -= 1
        if self._waiting == 0:
            self._fire()

    def _fire(self) -> None:
        items = sorted(self._obs.items())
        if self._enabled and len(items) > 1:
            ob0, stop0 = items[0][1]
            if all(ob == ob0 and stop == stop0 for _, (ob, stop) in items[1:]):
                policy = self._policy
                assert isinstance(policy, GroupTokenCompleter)
                self._slot = {g: i for i, (g, _) in enumerate(items)}
                self._shared = asyncio.ensure_future(
                    self._clock.sample(policy.sample_group(ob0, stop0, len(items)))
                )
        self._ready.set()

    async def action(self, g: int, ob: Observation, stop: StopCondition) -> TokensWithLogprobs | None:
        """The member's first action from the shared request, or ``None``: sample it yourself."""
        self._obs[g] = (ob, stop)
        self._arrive()
        await self._ready.wait()
        if self._shared is None:
            return None
        actions = await asyncio.shield(self._shared)
        return actions[self._slot[g]]


def _seeded(policy: TokenCompleter, seed: int | None, *key: int | str) -> TokenCompleter:
    """``policy`` with its requests seeded by ``sampling_seed(seed, *key)`` (when it can be)."""
    if seed is None or not isinstance(policy, SeedableTokenCompleter):
        return policy
    return policy.with_seed(sampling_seed(seed, *key))


async def _play(
    env: Env,
    policy_at: Callable[[int], TokenCompleter],
    config: RolloutConfig,
    clock: _Clock,
    first: tuple[_FirstTurn, int] | None,
) -> tuple[Trajectory, EndReason]:
    """One episode, to its end or to a budget. ``policy_at(turn)``: the policy of a turn;
    ``first``: the group's first-turn batcher."""
    reported = False
    try:
        ob, stop = await clock.env(env.initial_observation())
        ac: TokensWithLogprobs | None = None
        if first is not None:
            batcher, g = first
            reported = True
            ac = await batcher.action(g, ob, stop)
    finally:
        if first is not None and not reported:
            first[0].withdraw()
    transitions: list[Transition] = []
    n_tokens = 0
    while True:
        if ac is None:
            ac = await clock.sample(policy_at(len(transitions))(ob, stop))
        result = await clock.env(env.step(list(ac.tokens)))
        reward = check_reward(result.reward, f"{type(env).__name__}.step (turn {len(transitions)})")
        n_tokens += len(ac.tokens)
        done, reason = result.episode_done, "done"
        if not done and config.max_turns is not None and len(transitions) + 1 >= config.max_turns:
            done, reason = True, "max_turns"
        if not done and config.max_trajectory_tokens is not None and n_tokens >= config.max_trajectory_tokens:
            done, reason = True, "token_budget"
        transitions.append(
            Transition(
                ob=ob,
                ac=ac,
                reward=reward,
                episode_done=done,
                metrics=result.metrics,
                masked=bool(result.metrics.get(MASK_TURN, 0) or result.metrics.get(PARSE_ERROR_MASKED, 0)),
            )
        )
        if done:
            return Trajectory(transitions=transitions, final_ob=result.next_observation), reason
        ob, stop, ac = result.next_observation, result.next_stop_condition, None


async def _with_timeout(aw: Awaitable[_T], seconds: float | None) -> _T:
    if seconds is None:
        return await aw
    try:
        async with asyncio.timeout(seconds):
            return await aw
    except TimeoutError as exc:
        raise TimeoutError(f"timed out after {seconds:g} s (RolloutConfig.rollout_timeout_s)") from exc


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
    clock = _Clock(stats, limits)
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
            envs_G = list(await _with_timeout(clock.env(placed.make_envs()), config.rollout_timeout_s))
            if not envs_G:
                raise EmptyGroupError(f"make_envs of {type(builder).__name__} returned no envs")
        except Exception as exc:  # the env's failure, counted
            stats.fail(exc, "make_envs")
            envs_G = []
        n_members = len(envs_G)
        batcher = (
            None
            if coordinated or n_members < 2
            else _FirstTurn(n_members, _seeded(policy, seed, "first"), clock, config.share_first_turn)
        )

        async def member(g: int, env: Env) -> tuple[Trajectory, Env, EndReason] | None:
            attempt = 0
            first = (batcher, g) if batcher is not None else None
            while True:

                def policy_at(turn: int, attempt: int = attempt) -> TokenCompleter:
                    return _seeded(policy, seed, "member", g, attempt, turn)

                try:
                    traj, reason = await _with_timeout(
                        _play(env, policy_at, config, clock, first), config.rollout_timeout_s
                    )
                    return traj, env, reason
                except Exception as exc:  # the env's failure (or a timeout), counted
                    stats.fail(exc, f"the rollout of member {g}")
                    if coordinated or attempt >= config.max_retries:
                        return None
                attempt += 1
                first = None
                try:
                    fresh = await _with_timeout(clock.env(placed.make_envs()), config.rollout_timeout_s)
                    env = list(fresh)[g]
                except Exception as exc:
                    stats.fail(exc, f"make_envs (retry of member {g})")
                    return None

        results = await asyncio.gather(*(member(g, env) for g, env in enumerate(envs_G)))
        finished = [r for r in results if r is not None]
        n_failed = n_members - len(finished)
        needed = max(1, math.ceil(config.min_group_fraction * n_members))
        if n_members and len(finished) >= needed:
            trajectories_G = [t for t, _, _ in finished]
            try:
                scored = await _with_timeout(
                    clock.env(placed.compute_group_rewards(trajectories_G, [e for _, e, _ in finished])),
                    config.rollout_timeout_s,
                )
                where = f"{type(builder).__name__}.compute_group_rewards"
                group = TrajectoryGroup(
                    trajectories_G=trajectories_G,
                    final_rewards_G=[check_reward(r, where) for r, _ in scored],
                    metrics_G=[m for _, m in scored],
                )
                end_reasons = [r for _, _, r in finished]
            except Exception as exc:
                stats.fail(exc, "compute_group_rewards")
    finally:
        try:
            await _with_timeout(placed.cleanup(), config.rollout_timeout_s)
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
