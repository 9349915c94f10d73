"""The per-token shaping terms (rl/shaping.py). Multi-teacher on-policy distillation: each group
is scored by the teacher of its tag (one teacher per dataset), an untagged group by the default
teacher or by none; per-tag metrics. The KL penalty and distillation added one way, in order."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import numpy as np
import pytest
import tinker

from tempering.rl.data import RaggedBatch, trajectories_to_batch
from tempering.rl.shaping import Distill, KLPenalty, Teachers, TokenTerm, shape_advantages
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


def _batch() -> RaggedBatch:
    return trajectories_to_batch([_group(), _group(), _group()], [np.zeros(2)] * 3)


def _run(teachers: Teachers, tags_P: list[list[str]]) -> tuple[list[list[float]], dict[str, float]]:
    terms: list[TokenTerm] = [Distill(teachers, 1.0)] if teachers.active else []
    out, metrics = asyncio.run(shape_advantages(_batch(), tags_P, terms))
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


def test_terms_add_to_the_advantages_in_order_each_from_the_unshaped_batch() -> None:
    """Distillation then the KL penalty: the same per-token arithmetic for both (delta_N added),
    equal to the two formulas written out; constant-reward groups kept only for distillation."""
    batch = trajectories_to_batch([_group(), _group(), _group()], [np.array([0.5, -0.5])] * 3)
    teacher, reference = ConstantTeacher(-1.5), ConstantTeacher(-0.25)
    distill = Distill(Teachers(teacher), 0.5)  # pyright: ignore[reportArgumentType]
    kl = KLPenalty(reference, 2.0)  # pyright: ignore[reportArgumentType]
    assert distill.keeps_constant_groups
    assert not kl.keeps_constant_groups
    out, metrics = asyncio.run(shape_advantages(batch, [[], [], []], [distill, kl]))
    mask = batch.mask_N > 0
    q = batch.logprobs_N[mask]  # -0.5 on every sampled token
    # distill: -0.5 * (q - (-1.5)) = -0.5; KL: r = q - (-0.25) = -0.25 everywhere, so r - mean(r) = 0.
    expected = batch.advantages_N[mask] - 0.5 * (q + 1.5) + 2.0 * 0.0
    assert out.advantages_N[mask].tolist() == pytest.approx(expected.tolist())
    assert out.advantages_N[~mask].tolist() == [0.0] * int((~mask).sum())
    assert metrics["distill/reverse_kl"] == pytest.approx(1.0)
    assert metrics["kl/policy_base"] == pytest.approx(-0.25)
    # The KL term is centred: a reference that disagrees on one datum moves that datum only
    # relative to the mean; the sum of its deltas over the trained tokens is 0.
    delta_N, _ = asyncio.run(KLPenalty(_Ragged(), 1.0)(batch, []))  # pyright: ignore[reportArgumentType]
    assert float(delta_N[mask].sum()) == pytest.approx(0.0, abs=1e-6)
    assert float(np.abs(delta_N[mask]).max()) > 0.1
    assert batch.advantages_N[mask].tolist() == [0.5, 0.5, -0.5, -0.5] * 3  # not modified


@attrs.define
class _Ragged:
    """A reference whose logprob of a sequence's tokens grows with each call."""

    calls: int = 0

    def compute_logprobs(self, prompt: tinker.ModelInput, /) -> _Done:
        self.calls += 1
        return _Done([None] + [-0.1 * self.calls] * (prompt.length - 1))


@attrs.define
class _WaitsForTheOthers:
    """A teacher whose every request waits until each of ``n_teachers`` teachers has one in
    flight: teachers scored one after another never get there."""

    started: set[int]
    everyone: asyncio.Event
    n_teachers: int
    logprob: float

    async def compute_logprobs(self, prompt: tinker.ModelInput, /) -> list[float | None]:
        self.started.add(id(self))
        if len(self.started) == self.n_teachers:
            self.everyone.set()
        await self.everyone.wait()
        return [None] + [self.logprob] * (prompt.length - 1)


def test_the_teachers_score_their_groups_concurrently() -> None:
    async def run() -> list[float]:
        started: set[int] = set()
        everyone = asyncio.Event()
        math, code = (_WaitsForTheOthers(started, everyone, 2, lp) for lp in (-1.5, -0.25))
        teachers = Teachers(None, {"math": math, "code": code})  # pyright: ignore[reportArgumentType]
        out, _ = await asyncio.wait_for(
            shape_advantages(_batch(), [["math"], ["code"], []], [Distill(teachers, 1.0)]), 5.0
        )
        return out.advantages_N[out.mask_N > 0].tolist()

    assert asyncio.run(run()) == [-1.0] * 4 + [0.25] * 4 + [0.0] * 4
