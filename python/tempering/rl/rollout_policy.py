"""Rollout policy, in one place: the limits of an episode, what hitting one does, the reward of a
rollout a limit stopped, how failures are handled, presets, and hooks.

=========================  ==========================================================================
limit (``None``: none)     counted as (``GroupRollout.end_reasons_G``, ``env/end/<reason>``,
                           ``env/limit_hits/<reason>``)
=========================  ==========================================================================
``max_turns``              ``max_turns``: the episode reached this many turns
``max_trajectory_tokens``  ``token_budget``: its sampled tokens reached this many
``max_total_tokens``       ``context_budget``: a turn's prompt plus sampled tokens reached this many
``max_tool_calls``         ``tool_calls``: the tool calls its env reported (``StepResult.metrics``
                           ``[TOOL_CALLS]``, summed over turns) reached this many
``rollout_timeout_s``      ``timeout``: the member's episode ran this long (wall clock)
``sample_timeout_s``       ``sample_timeout``: one sampling call ran this long
=========================  ==========================================================================

What a limit does: ``on_limit="end"`` (default) ends the episode there; the trajectory is kept
and graded (``compute_group_rewards`` sees it). ``on_limit="fail"`` fails the member instead
(``rollout/failed/LimitExceeded``). The wall-clock limits have their own switch, ``on_timeout``,
whose default ``"fail"`` keeps the earlier behaviour (a member that stops answering fails);
``"end"`` keeps the turns played before the timeout (a member with none fails).

Termination reward: ``limit_reward="clamp"`` grades a rollout stopped by a limit as usual, then
clamps its total reward to at most 0 (the group reward absorbs the difference), so a policy
cannot earn reward by running into a limit; ``"keep"`` (default) leaves it.

Failures: ``failure="tolerate"`` (default) counts a failed member (``rollout/failed/<Type>``),
replays it up to ``max_retries`` times on a fresh env, and keeps the group when at least
``min_group_fraction`` of its members finished; ``failure="fail_fast"`` raises the first
failure out of the rollout (:class:`RolloutFailFastError`), stopping the run.

Hooks: ``on_turn`` functions are called after every turn with a :class:`TurnInfo`, ``on_rollout``
functions after every finished member with a :class:`RolloutInfo`. A hook that raises fails that
member as an env failure (counted by the exception's type; the run goes on). Hooks must pickle
(module-level functions) since the config does.

Example::

    config = RolloutConfig.preset("agent", max_tool_calls=4, limit_reward="clamp")
    config = RolloutConfig(max_total_tokens=4096, sample_timeout_s=30, on_turn=(log_turn,))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

import attrs

from tempering_protocols import Metrics, Trajectory
from tempering_protocols.rl import TOOL_CALLS

__all__ = [
    "LIMIT_REASONS",
    "PRESETS",
    "TOOL_CALLS",
    "EndReason",
    "LimitExceededError",
    "RolloutConfig",
    "RolloutFailFastError",
    "RolloutInfo",
    "TurnInfo",
    "clamped_final_reward",
]

EndReason: TypeAlias = Literal[
    "done", "max_turns", "token_budget", "context_budget", "tool_calls", "timeout", "sample_timeout"
]
LIMIT_REASONS: tuple[EndReason, ...] = (
    "max_turns",
    "token_budget",
    "context_budget",
    "tool_calls",
    "timeout",
    "sample_timeout",
)
"""Every end reason that is a limit (all but ``done``)."""

OnLimit: TypeAlias = Literal["end", "fail"]
LimitReward: TypeAlias = Literal["keep", "clamp"]
FailureStrategy: TypeAlias = Literal["tolerate", "fail_fast"]


class LimitExceededError(RuntimeError):
    """A member hit a limit under ``on_limit="fail"`` (or a timeout under ``on_timeout="fail"``
    with no turn to keep); the message names the limit and its value."""


class RolloutFailFastError(RuntimeError):
    """``failure="fail_fast"``: a member (or a group's ``make_envs`` / ``compute_group_rewards``)
    failed; the first failure is the ``__cause__``."""


@attrs.frozen
class TurnInfo:
    """What an ``on_turn`` hook sees after a turn: the member, the turn's index, the tokens of its
    prompt and action, the episode's sampled tokens so far, its reward and metrics."""

    member: int
    turn: int
    prompt_tokens: int
    sampled_tokens: int
    episode_sampled_tokens: int
    reward: float
    metrics: Metrics
    episode_done: bool


@attrs.frozen
class RolloutInfo:
    """What an ``on_rollout`` hook sees after a member's episode: the trajectory and why it ended."""

    member: int
    trajectory: Trajectory
    end_reason: EndReason


TurnHook: TypeAlias = Callable[[TurnInfo], object]
RolloutHook: TypeAlias = Callable[[RolloutInfo], object]


def _positive_int(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value < 1):
        raise ValueError(f"RolloutConfig.{name} must be >= 1 (or None: no limit), got {value!r}")


def _positive_seconds(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"RolloutConfig.{name} must be a finite number > 0 (or None: no limit), got {value!r}"
        )


def _choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(
            f"RolloutConfig.{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}"
        )


@attrs.frozen
class RolloutConfig:
    """How rollouts run (see the module docstring for the limits and what they do). Every field
    has a safe default: an env that never ends its episode stops at ``max_turns`` (64) turns, and
    one that never answers fails after ``rollout_timeout_s`` (600 s); pass ``None`` to lift either.

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
    max_total_tokens: int | None = None
    """End an episode once a turn's prompt plus its sampled tokens reach this many."""
    max_tool_calls: int | None = None
    """End an episode once the tool calls its env reported (``metrics[TOOL_CALLS]``) reach this many."""
    sample_timeout_s: float | None = None
    """Wall-clock limit of one sampling call; ``None``: none."""
    on_limit: OnLimit = "end"
    """A turn, token or tool-call limit: ``end`` the episode (kept, graded) or ``fail`` the member."""
    on_timeout: OnLimit = "fail"
    """A wall-clock limit: ``fail`` the member, or ``end`` it keeping the turns played."""
    limit_reward: LimitReward = "keep"
    """``clamp``: a rollout a limit stopped gets a total reward of at most 0 (after grading)."""
    failure: FailureStrategy = "tolerate"
    """``tolerate`` failed members (retries, ``min_group_fraction``) or ``fail_fast``."""
    on_turn: tuple[TurnHook, ...] = ()
    """Called after every turn with a :class:`TurnInfo`; a raise fails the member."""
    on_rollout: tuple[RolloutHook, ...] = ()
    """Called after every finished member with a :class:`RolloutInfo`; a raise fails the member."""

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
        for name in ("max_trajectory_tokens", "max_total_tokens", "max_tool_calls"):
            _positive_int(name, getattr(self, name))
        _positive_seconds("sample_timeout_s", self.sample_timeout_s)
        _choice("on_limit", self.on_limit, ("end", "fail"))
        _choice("on_timeout", self.on_timeout, ("end", "fail"))
        _choice("limit_reward", self.limit_reward, ("keep", "clamp"))
        _choice("failure", self.failure, ("tolerate", "fail_fast"))
        for name in ("on_turn", "on_rollout"):
            for hook in getattr(self, name):
                if not callable(hook):
                    raise TypeError(f"RolloutConfig.{name} holds {hook!r}, which is not callable")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> RolloutConfig:
        """A preset of :data:`PRESETS` (``short_answer``, ``reasoning``, ``agent``), with
        ``overrides`` on top.

        Example::

            RolloutConfig.preset("reasoning", max_total_tokens=8192)
        """
        if name not in PRESETS:
            raise ValueError(f"unknown rollout preset {name!r}; the presets are {', '.join(sorted(PRESETS))}")
        return attrs.evolve(PRESETS[name], **overrides)


PRESETS: dict[str, RolloutConfig] = {
    "short_answer": RolloutConfig(
        max_turns=1, rollout_timeout_s=120.0, sample_timeout_s=60.0, min_group_fraction=1.0
    ),
    "reasoning": RolloutConfig(
        max_turns=1,
        max_total_tokens=16384,
        rollout_timeout_s=1800.0,
        sample_timeout_s=1200.0,
        on_timeout="end",
        limit_reward="clamp",
        max_retries=1,
        min_group_fraction=0.75,
    ),
    "agent": RolloutConfig(
        max_turns=16,
        max_total_tokens=32768,
        max_tool_calls=32,
        rollout_timeout_s=1800.0,
        sample_timeout_s=300.0,
        on_timeout="end",
        limit_reward="clamp",
        max_retries=1,
        min_group_fraction=0.5,
    ),
}
"""Rollout presets: ``short_answer`` (one turn, tight timeouts, every member needed);
``reasoning`` (one long turn: a context budget, a graceful timeout, limit-stopped rollouts
clamped to reward <= 0, one retry, 75% of a group needed); ``agent`` (multi-turn tool use: turn,
context and tool-call budgets, graceful timeouts, clamping, one retry, half a group needed)."""


def clamped_final_reward(trajectory: Trajectory, final_reward: float) -> float:
    """The group reward that makes ``trajectory``'s total (its step rewards plus this) at most 0.

    Example::

        clamped_final_reward(traj_with_step_rewards_summing_to_1, 0.5)  # -1.0: total 0
    """
    total = trajectory.total_reward + final_reward
    return final_reward - max(0.0, total)
