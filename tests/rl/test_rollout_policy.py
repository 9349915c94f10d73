"""The rollout policy (RolloutConfig): limits and what hitting one does, graceful and failing
timeouts, the termination-reward clamp, fail-fast, presets, hooks, limit hits in the metrics."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Sequence

import attrs
import pytest
import tinker

from tempering.rl.metrics import rollout_metrics
from tempering.rl.rollout_policy import PRESETS, TOOL_CALLS, RolloutInfo, TurnInfo
from tempering.rl.rollouts import GroupRollout, RolloutConfig, RolloutFailFastError, rollout_group
from tempering_protocols import (
    Action,
    Env,
    EnvGroupBuilder,
    Observation,
    StepResult,
    StopCondition,
    TokensWithLogprobs,
)

STOP = 0


@attrs.define
class Policy:
    """Answers ``[7, STOP]``; sleeps ``delay`` seconds from request ``slow_from`` on."""

    delay: float = 0.0
    slow_from: int = 0
    n: int = 0

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        self.n += 1
        if self.n > self.slow_from and self.delay:
            await asyncio.sleep(self.delay)
        return TokensWithLogprobs(tokens=[7, STOP], maybe_logprobs=[-0.5, -0.5])


@attrs.define
class GrowingEnv(Env):
    """``turns`` turns, reward 1 each; the observation grows by 3 tokens a turn; each turn reports
    ``tool_calls`` tool calls; hangs at turn ``hang_at``."""

    turns: int = 10
    tool_calls: int = 0
    hang_at: int | None = None
    t: int = 0

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.from_ints([1, 2]), [STOP]

    async def step(self, action: Action, /) -> StepResult:
        if self.hang_at == self.t:
            await asyncio.sleep(30)
        self.t += 1
        return StepResult(
            reward=1.0,
            episode_done=self.t >= self.turns,
            next_observation=tinker.ModelInput.from_ints([1, 2] + [3] * (3 * self.t)),
            next_stop_condition=[STOP],
            metrics={TOOL_CALLS: self.tool_calls} if self.tool_calls else {},
        )


@attrs.define(eq=False)
class Group(EnvGroupBuilder):
    envs: list[dict[str, int | None]]
    final: float = 0.0

    async def make_envs(self) -> Sequence[Env]:
        return [GrowingEnv(**spec) for spec in self.envs]  # pyright: ignore[reportArgumentType]

    async def compute_group_rewards(
        self, trajectory_group: Sequence[object], env_group: Sequence[Env]
    ) -> list[tuple[float, dict[str, float | int]]]:
        return [(self.final, {}) for _ in trajectory_group]


def _run(group: Group, config: RolloutConfig, policy: Policy | None = None) -> GroupRollout:
    return asyncio.run(rollout_group(group, policy or Policy(), config))


def _one(**spec: int | None) -> Group:
    return Group([spec, {"turns": 1}])


# ------------------------------------------------------------------------------------- limits


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_total_tokens", 0),
        ("max_tool_calls", -1),
        ("max_trajectory_tokens", 0),
        ("sample_timeout_s", 0.0),
        ("sample_timeout_s", float("inf")),
        ("on_limit", "stop"),
        ("on_timeout", "ignore"),
        ("limit_reward", "zero"),
        ("failure", "panic"),
    ],
)
def test_a_bad_limit_or_choice_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"RolloutConfig\.{field}"):
        RolloutConfig(**{field: value})  # pyright: ignore[reportArgumentType]


def test_a_hook_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match=r"RolloutConfig\.on_turn holds 3"):
        RolloutConfig(on_turn=(3,))  # pyright: ignore[reportArgumentType]


def test_prompt_plus_sampled_tokens_end_the_episode_and_are_counted() -> None:
    # Turn k's prompt is 2 + 3k tokens, its action 2: turn 2 reaches 2 + 6 + 2 = 10.
    rollout = _run(_one(turns=10), RolloutConfig(max_total_tokens=10))
    assert rollout.group is not None
    assert list(rollout.end_reasons_G) == ["context_budget", "done"]
    assert len(rollout.group.trajectories_G[0].transitions) == 3
    assert rollout.group.trajectories_G[0].transitions[-1].episode_done
    metrics = rollout_metrics([rollout])
    assert metrics["env/limit_hits/context_budget"] == 1.0
    assert metrics["env/end/context_budget"] == 0.5


def test_tool_calls_reported_by_the_env_end_the_episode() -> None:
    rollout = _run(_one(turns=10, tool_calls=2), RolloutConfig(max_tool_calls=5))
    assert rollout.group is not None
    assert rollout.end_reasons_G[0] == "tool_calls"
    assert len(rollout.group.trajectories_G[0].transitions) == 3  # 2, 4, 6 >= 5
    assert rollout_metrics([rollout])["env/limit_hits/tool_calls"] == 1.0


def test_on_limit_fail_fails_the_member_instead() -> None:
    rollout = _run(_one(turns=10), RolloutConfig(max_turns=2, on_limit="fail", min_group_fraction=0.5))
    assert rollout.n_failed == 1
    assert rollout.failures == {"rollout/failed/LimitExceededError": 1}
    assert "RolloutConfig.max_turns" in str(rollout.first_error)


# ------------------------------------------------------------------------------------- timeouts


def test_a_rollout_timeout_fails_by_default_and_ends_gracefully_when_asked() -> None:
    failing = _run(_one(turns=5, hang_at=2), RolloutConfig(rollout_timeout_s=0.3, min_group_fraction=0.5))
    assert failing.n_failed == 1
    assert failing.failures == {"rollout/failed/TimeoutError": 1}
    kept = _run(_one(turns=5, hang_at=2), RolloutConfig(rollout_timeout_s=0.3, on_timeout="end"))
    assert kept.group is not None
    assert kept.n_failed == 0
    assert list(kept.end_reasons_G) == ["timeout", "done"]
    traj = kept.group.trajectories_G[0]
    assert len(traj.transitions) == 2
    assert traj.transitions[-1].episode_done
    assert rollout_metrics([kept])["env/limit_hits/timeout"] == 1.0


def test_a_sampling_call_timeout() -> None:
    slow = Policy(delay=5.0, slow_from=2)  # requests 3, 4, ... hang
    config = RolloutConfig(sample_timeout_s=0.2, min_group_fraction=0.5)
    failing = _run(Group([{"turns": 5}]), config, slow)
    assert failing.failures == {"rollout/failed/TimeoutError": 1}
    assert "RolloutConfig.sample_timeout_s" in str(failing.first_error)
    kept = _run(Group([{"turns": 5}]), attrs.evolve(config, on_timeout="end"), Policy(delay=5.0, slow_from=2))
    assert kept.group is not None
    assert list(kept.end_reasons_G) == ["sample_timeout"]
    assert len(kept.group.trajectories_G[0].transitions) == 2


# ------------------------------------------------------------------------------------- reward


def test_clamp_grades_then_caps_a_limit_stopped_rollout_at_zero() -> None:
    group = Group([{"turns": 10}, {"turns": 2}], final=0.5)
    kept = _run(group, RolloutConfig(max_turns=3))
    assert kept.group is not None
    assert kept.group.get_total_rewards() == [3.5, 2.5]
    clamped = _run(group, RolloutConfig(max_turns=3, limit_reward="clamp"))
    assert clamped.group is not None
    # The limit-stopped member: 3 step rewards + 0.5 graded, clamped to 0; the other is untouched.
    assert clamped.group.get_total_rewards() == [0.0, 2.5]
    assert list(clamped.end_reasons_G) == ["max_turns", "done"]


def test_clamp_keeps_a_negative_total() -> None:
    clamped = _run(Group([{"turns": 10}], final=-5.0), RolloutConfig(max_turns=2, limit_reward="clamp"))
    assert clamped.group is not None
    assert clamped.group.get_total_rewards() == [-3.0]


# ------------------------------------------------------------------------------------- failures, hooks


def test_fail_fast_raises_the_first_failure() -> None:
    config = RolloutConfig(max_turns=2, on_limit="fail", failure="fail_fast")
    with pytest.raises(RolloutFailFastError, match="member 0") as info:
        _run(_one(turns=10), config)
    assert "RolloutConfig.max_turns" in str(info.value.__cause__)


TURNS: list[TurnInfo] = []
ENDS: list[RolloutInfo] = []


def record_turn(info: TurnInfo) -> None:
    TURNS.append(info)


def record_rollout(info: RolloutInfo) -> None:
    ENDS.append(info)


def refuse_member_one(info: RolloutInfo) -> None:
    if info.member == 1:
        raise LookupError("the hook refuses member 1")


def test_hooks_see_every_turn_and_rollout() -> None:
    TURNS.clear()
    ENDS.clear()
    config = RolloutConfig(on_turn=(record_turn,), on_rollout=(record_rollout,))
    pickle.dumps(config)  # hooks are module-level functions: the config still pickles
    rollout = _run(Group([{"turns": 2}, {"turns": 1}]), config)
    assert rollout.group is not None
    assert sorted((t.member, t.turn, t.prompt_tokens, t.episode_done) for t in TURNS) == [
        (0, 0, 2, False),
        (0, 1, 5, True),
        (1, 0, 2, True),
    ]
    assert sorted((e.member, e.end_reason, len(e.trajectory.transitions)) for e in ENDS) == [
        (0, "done", 2),
        (1, "done", 1),
    ]


def test_a_raising_hook_fails_its_member_and_the_run_goes_on() -> None:
    config = RolloutConfig(on_rollout=(refuse_member_one,), min_group_fraction=0.5)
    rollout = _run(Group([{"turns": 1}, {"turns": 1}, {"turns": 1}]), config)
    assert rollout.group is not None
    assert len(rollout.group.trajectories_G) == 2
    assert rollout.failures == {"rollout/failed/LookupError": 1}


# ------------------------------------------------------------------------------------- presets


def test_presets_and_overrides() -> None:
    assert set(PRESETS) == {"short_answer", "reasoning", "agent"}
    agent = RolloutConfig.preset("agent", max_tool_calls=4)
    assert agent.max_tool_calls == 4
    assert agent.limit_reward == "clamp"
    assert agent.on_timeout == "end"
    assert RolloutConfig.preset("short_answer").max_turns == 1
    with pytest.raises(ValueError, match="unknown rollout preset 'chat'; the presets are agent"):
        RolloutConfig.preset("chat")
    with pytest.raises(ValueError, match=r"RolloutConfig\.max_total_tokens"):
        RolloutConfig.preset("reasoning", max_total_tokens=0)
