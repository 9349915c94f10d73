"""One member's episode: the timing of its calls, the group's shared first turn, and the play
of the episode under the rollout policy's limits, timeouts and hooks
(:mod:`tempering.rl.rollout_policy`). :mod:`tempering.rl.rollouts` plays groups with these."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import attrs

from tempering.rl.policy import GroupTokenCompleter, SeedableTokenCompleter, sampling_seed
from tempering.rl.rollout_failures import FailureStats, check_reward
from tempering.rl.rollout_policy import EndReason, LimitExceededError, RolloutConfig, RolloutInfo, TurnInfo
from tempering_protocols import (
    Env,
    Observation,
    StopCondition,
    TokenCompleter,
    TokensWithLogprobs,
    Trajectory,
    Transition,
)
from tempering_protocols.rl import TOOL_CALLS, metrics_mask_turn

__all__ = ["Clock", "FirstTurn", "RolloutLimits", "play_member", "seeded", "with_timeout"]

_T = TypeVar("_T")


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


async def with_timeout(aw: Awaitable[_T], seconds: float | None) -> _T:
    """``aw`` under a wall-clock limit of ``seconds`` (``None``: none); the ``TimeoutError`` names
    ``RolloutConfig.rollout_timeout_s``."""
    if seconds is None:
        return await aw
    try:
        async with asyncio.timeout(seconds):
            return await aw
    except TimeoutError as exc:
        raise TimeoutError(f"timed out after {seconds:g} s (RolloutConfig.rollout_timeout_s)") from exc


class Clock:
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


class FirstTurn:
    """Gathers the first observations of a group's members; when all are equal, samples them
    once with ``num_samples = G``. A member that fails before reporting withdraws."""

    def __init__(self, n: int, policy: TokenCompleter, clock: Clock, enabled: bool) -> None:
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


def seeded(policy: TokenCompleter, seed: int | None, *key: int | str) -> TokenCompleter:
    """``policy`` with its requests seeded by ``sampling_seed(seed, *key)`` (when it can be)."""
    if seed is None or not isinstance(policy, SeedableTokenCompleter):
        return policy
    return policy.with_seed(sampling_seed(seed, *key))


@attrs.define
class _Episode:
    """A member's episode as it is played (:meth:`play`): the turns so far and the observation
    it is on, kept here so that a graceful timeout can keep what was played (:meth:`cut`)."""

    member: int
    transitions: list[Transition] = attrs.field(factory=list[Transition])
    ob: Observation | None = None

    def cut(self, reason: EndReason) -> tuple[Trajectory, EndReason]:
        """The turns played so far as a finished trajectory (a timeout under ``on_timeout="end"``)."""
        if not self.transitions:
            raise LimitExceededError(f"{_LIMIT_NAMES[reason]} was reached before the first turn finished")
        *head, last = self.transitions
        final_ob = self.ob if self.ob is not None else last.ob
        return Trajectory(
            transitions=[*head, attrs.evolve(last, episode_done=True)], final_ob=final_ob
        ), reason

    async def play(
        self,
        env: Env,
        policy_at: Callable[[int], TokenCompleter],
        config: RolloutConfig,
        clock: Clock,
        first: tuple[FirstTurn, int] | None,
    ) -> tuple[Trajectory, EndReason]:
        """Play the episode to its end or to a limit, keeping each turn here as it finishes.
        ``policy_at(turn)``: the policy of a turn; ``first``: the group's first-turn batcher."""
        reported = False
        try:
            ob, stop = await clock.env(env.initial_observation())
            self.ob = ob
            ac: TokensWithLogprobs | None = None
            if first is not None:
                batcher, g = first
                reported = True
                ac = await batcher.action(g, ob, stop)
        finally:
            if first is not None and not reported:
                first[0].withdraw()
        transitions = self.transitions
        n_tokens = n_tool_calls = 0
        while True:
            if ac is None:
                ac = await _sample(clock, policy_at(len(transitions))(ob, stop), config.sample_timeout_s)
            result = await clock.env(env.step(list(ac.tokens)))
            reward = check_reward(result.reward, f"{type(env).__name__}.step (turn {len(transitions)})")
            n_tokens += len(ac.tokens)
            n_tool_calls += int(result.metrics.get(TOOL_CALLS, 0))
            done, reason = result.episode_done, "done"
            if not done:
                context = ob.length + len(ac.tokens)
                hit = _limit_hit(config, len(transitions) + 1, n_tokens, context, n_tool_calls)
                if hit is not None and config.on_limit == "fail":
                    raise LimitExceededError(f"{_LIMIT_NAMES[hit]} was reached at turn {len(transitions)}")
                if hit is not None:
                    done, reason = True, hit
            transitions.append(
                Transition(
                    ob=ob,
                    ac=ac,
                    reward=reward,
                    episode_done=done,
                    metrics=result.metrics,
                    masked=metrics_mask_turn(result.metrics),
                )
            )
            self.ob = result.next_observation
            info = TurnInfo(
                member=self.member,
                turn=len(transitions) - 1,
                prompt_tokens=ob.length,
                sampled_tokens=len(ac.tokens),
                episode_sampled_tokens=n_tokens,
                reward=reward,
                metrics=result.metrics,
                episode_done=done,
            )
            for hook in config.on_turn:
                hook(info)
            if done:
                return Trajectory(transitions=transitions, final_ob=result.next_observation), reason
            ob, stop, ac = result.next_observation, result.next_stop_condition, None


_LIMIT_NAMES: dict[str, str] = {
    "max_turns": "RolloutConfig.max_turns",
    "token_budget": "RolloutConfig.max_trajectory_tokens",
    "context_budget": "RolloutConfig.max_total_tokens",
    "tool_calls": "RolloutConfig.max_tool_calls",
    "timeout": "RolloutConfig.rollout_timeout_s",
    "sample_timeout": "RolloutConfig.sample_timeout_s",
}


class _SampleTimeoutError(Exception):
    """One sampling call ran past ``sample_timeout_s``."""


def _limit_hit(
    config: RolloutConfig, turns: int, sampled: int, context: int, tool_calls: int
) -> EndReason | None:
    if config.max_turns is not None and turns >= config.max_turns:
        return "max_turns"
    if config.max_trajectory_tokens is not None and sampled >= config.max_trajectory_tokens:
        return "token_budget"
    if config.max_total_tokens is not None and context >= config.max_total_tokens:
        return "context_budget"
    if config.max_tool_calls is not None and tool_calls >= config.max_tool_calls:
        return "tool_calls"
    return None


async def _sample(clock: Clock, aw: Awaitable[_T], seconds: float | None) -> _T:
    if seconds is None:
        return await clock.sample(aw)
    try:
        async with asyncio.timeout(seconds):
            return await clock.sample(aw)
    except TimeoutError:
        raise _SampleTimeoutError from None


async def play_member(
    env: Env,
    policy_at: Callable[[int], TokenCompleter],
    config: RolloutConfig,
    clock: Clock,
    first: tuple[FirstTurn, int] | None,
    member: int,
) -> tuple[Trajectory, EndReason]:
    """:meth:`_Episode.play` under the wall-clock limits: a timeout fails the member, or
    (``on_timeout="end"``) ends it with the turns played; then the ``on_rollout`` hooks."""
    episode = _Episode(member)
    try:
        traj, reason = await with_timeout(
            episode.play(env, policy_at, config, clock, first), config.rollout_timeout_s
        )
    except _SampleTimeoutError:
        if config.on_timeout == "fail":
            seconds = config.sample_timeout_s
            raise TimeoutError(
                f"a sampling call timed out after {seconds} s (RolloutConfig.sample_timeout_s)"
            ) from None
        traj, reason = episode.cut("sample_timeout")
    except TimeoutError:
        if config.on_timeout == "fail":
            raise
        traj, reason = episode.cut("timeout")
    for hook in config.on_rollout:
        hook(RolloutInfo(member=member, trajectory=traj, end_reason=reason))
    return traj, reason
