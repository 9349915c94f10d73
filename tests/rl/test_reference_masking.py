"""An env written for the Tinker Cookbook masks a turn with ``metrics["parse_error_masked"] = 1``;
the rollout marks that turn exactly as ``MASK_TURN`` does, so it trains on nothing. A
``Transition`` built by user code (or read from a Cookbook log) that carries either key but not
``masked=True`` is masked by the data core too."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs
import numpy as np
import pytest
import tinker

from tempering.rl.data import trajectories_to_datums
from tempering.rl.rollouts import RolloutConfig, rollout_group
from tempering_protocols import (
    MASK_TURN,
    PARSE_ERROR_MASKED,
    Action,
    Env,
    EnvGroupBuilder,
    Observation,
    StepResult,
    StopCondition,
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
)

STOP = 0


class Policy:
    """Answers ``[turn + 5, STOP]`` at every turn (the turn read off the observation's length)."""

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        turn = model_input.length
        return TokensWithLogprobs(tokens=[turn + 5, STOP], maybe_logprobs=[-0.25, -0.5])


@attrs.define
class ParseErrorEnv(Env):
    """Three turns, reward 1 each; turn ``masked_turn`` reports ``{key: value}`` in its metrics."""

    key: str
    value: float = 1.0
    masked_turn: int = 1
    t: int = 0

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.from_ints([1, 2]), [STOP]

    async def step(self, action: Action, /) -> StepResult:
        self.t += 1
        return StepResult(
            reward=1.0,
            episode_done=self.t >= 3,
            next_observation=tinker.ModelInput.from_ints([3]),
            next_stop_condition=[STOP],
            metrics={self.key: self.value, "format": 0.0}
            if self.t - 1 == self.masked_turn
            else {"format": 1.0},
        )


@attrs.define(eq=False)
class Builder(EnvGroupBuilder):
    key: str
    value: float = 1.0

    async def make_envs(self) -> Sequence[Env]:
        return [ParseErrorEnv(self.key, self.value) for _ in range(2)]


def _group(key: str, value: float = 1.0) -> TrajectoryGroup:
    rollout = asyncio.run(rollout_group(Builder(key, value), Policy(), RolloutConfig(share_first_turn=False)))
    assert rollout.group is not None
    return rollout.group


def _inputs(group: TrajectoryGroup) -> list[dict[str, np.ndarray]]:
    data, _ = trajectories_to_datums([group], [np.array([1.0, -1.0])])
    return [{k: v.to_numpy() for k, v in d.loss_fn_inputs.items()} for d in data]


@pytest.mark.timeout(60)
def test_parse_error_masked_masks_the_turn_like_mask_turn() -> None:
    reference = _group(PARSE_ERROR_MASKED)
    ours = _group(MASK_TURN)
    for trajectory in reference.trajectories_G:
        assert [t.masked for t in trajectory.transitions] == [False, True, False]
    ref_inputs, our_inputs = _inputs(reference), _inputs(ours)
    # The observations don't extend each other: one datum per turn, 3 per trajectory.
    assert len(ref_inputs) == len(our_inputs) == 6
    for ref, mine in zip(ref_inputs, our_inputs, strict=True):
        assert set(ref) == set(mine)
        for key in ref:
            np.testing.assert_array_equal(ref[key], mine[key], err_msg=key)
    # The masked turn's two action tokens carry no mask and no advantage; the others do.
    assert [float(d["mask"].sum()) for d in ref_inputs] == [2.0, 0.0, 2.0] * 2
    assert [np.count_nonzero(d["advantages"]) for d in ref_inputs] == [2, 0, 2] * 2


def test_parse_error_masked_zero_trains_the_turn() -> None:
    group = _group(PARSE_ERROR_MASKED, value=0.0)
    for trajectory in group.trajectories_G:
        assert not any(t.masked for t in trajectory.transitions)
    assert [float(d["mask"].sum()) for d in _inputs(group)] == [2.0] * 6


def _built_by_hand(metrics: dict[str, float | int]) -> TrajectoryGroup:
    """Two single-turn trajectories written without the rollout: the second's turn has ``metrics``
    and ``masked`` left at its default (False)."""

    def one(m: dict[str, float | int]) -> Trajectory:
        ac = TokensWithLogprobs(tokens=[7, STOP], maybe_logprobs=[-0.25, -0.5])
        tr = Transition(
            ob=tinker.ModelInput.from_ints([1, 2]), ac=ac, reward=1.0, episode_done=True, metrics=m
        )
        return Trajectory(transitions=[tr], final_ob=tinker.ModelInput.empty())

    return TrajectoryGroup(
        trajectories_G=[one({}), one(metrics)], final_rewards_G=[0.0, 0.0], metrics_G=[{}, {}]
    )


@pytest.mark.parametrize("key", [PARSE_ERROR_MASKED, MASK_TURN])
def test_the_data_core_masks_a_hand_built_transition_by_its_metrics(key: str) -> None:
    group = _built_by_hand({key: 1, "format": 0.0})
    assert not group.trajectories_G[1].transitions[0].masked  # the field says nothing
    inputs = _inputs(group)
    assert [float(d["mask"].sum()) for d in inputs] == [2.0, 0.0]
    assert [np.count_nonzero(d["advantages"]) for d in inputs] == [2, 0]
    # A key set to 0 (or absent) trains the turn.
    assert [float(d["mask"].sum()) for d in _inputs(_built_by_hand({key: 0}))] == [2.0, 2.0]
