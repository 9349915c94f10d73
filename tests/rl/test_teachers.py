"""Multi-teacher on-policy distillation: each group is scored by the teacher of its tag (one
teacher per dataset), an untagged group by the default teacher or by none; per-tag metrics."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import numpy as np
import pytest
import tinker

from tempering.rl.data import trajectories_to_batch
from tempering.rl.teachers import Teachers, apply_teachers_and_reference
from tempering_protocols import TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition


@attrs.define
class _Done:
    value: list[float | None]

    def result(self, timeout: float | None = None, /) -> list[float | None]:
        return self.value

    def __await__(self) -> Any:
        if False:  # pragma: no cover - makes this a generator
            yield
        return self.value


@attrs.define
class ConstantTeacher:
    """Scores every token ``logprob``; counts the sequences it scored."""

    logprob: float
    scored: int = 0

    def compute_logprobs(self, prompt: tinker.ModelInput, /) -> _Done:
        self.scored += 1
        return _Done([None] + [self.logprob] * (prompt.length - 1))


def _group() -> TrajectoryGroup:
    def one() -> Trajectory:
        ac = TokensWithLogprobs(tokens=[5, 6], maybe_logprobs=[-0.5, -0.5])
        tr = Transition(ob=tinker.ModelInput.from_ints([1, 2]), ac=ac, reward=0.0, episode_done=True)
        return Trajectory(transitions=[tr], final_ob=tinker.ModelInput.empty())

    return TrajectoryGroup(trajectories_G=[one(), one()], final_rewards_G=[0.0, 0.0], metrics_G=[{}, {}])


def _run(teachers: Teachers, tags_P: list[list[str]]) -> tuple[list[list[float]], dict[str, float]]:
    batch = trajectories_to_batch([_group(), _group(), _group()], [np.zeros(2)] * 3)
    out, metrics = asyncio.run(apply_teachers_and_reference(batch, tags_P, teachers, None, 1.0, 0.0))
    per_datum: list[list[float]] = []
    for d in range(out.n_datums):
        sl = slice(int(out.offsets_D1[d]), int(out.offsets_D1[d + 1]))
        per_datum.append(out.advantages_N[sl][out.mask_N[sl] > 0].tolist())
    return per_datum, metrics


def test_each_group_is_scored_by_the_teacher_of_its_tag() -> None:
    math, code, default = ConstantTeacher(-1.5), ConstantTeacher(-0.25), ConstantTeacher(-0.5)
    teachers = Teachers(default, {"math": math, "code": code})  # pyright: ignore[reportArgumentType]
    adv, metrics = _run(teachers, [["math"], ["code"], ["other"]])
    # advantage -= (q - p_teacher) with q = -0.5: math +1.0 per token, code -0.25, default 0.
    assert adv == [[-1.0, -1.0]] * 2 + [[0.25, 0.25]] * 2 + [[0.0, 0.0]] * 2
    assert (math.scored, code.scored, default.scored) == (2, 2, 2)
    assert metrics["distill/reverse_kl/math"] == pytest.approx(1.0)
    assert metrics["distill/reverse_kl/code"] == pytest.approx(-0.25)


def test_a_group_without_a_teacher_gets_no_term() -> None:
    math = ConstantTeacher(-1.5)
    adv, metrics = _run(Teachers(None, {"math": math}), [["math"], [], ["chat"]])  # pyright: ignore[reportArgumentType]
    assert adv == [[-1.0, -1.0]] * 2 + [[0.0, 0.0]] * 4
    assert metrics["distill/reverse_kl"] == pytest.approx(1.0)  # over the distilled tokens only


def test_no_teacher_leaves_the_batch_alone() -> None:
    adv, metrics = _run(Teachers(), [[], [], []])
    assert adv == [[0.0, 0.0]] * 6
    assert metrics == {}
