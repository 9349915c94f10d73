"""The figures recipes report, computed in the library: the spread over evaluation seeds,
an accuracy record's logged metrics and viewer episodes, and DPO's held-out pair figures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tempering.envs.problem import Problem
from tempering.evals.accuracy import EvalRecord, SampledAnswer
from tempering.evals.stats import Spread, wilson_interval
from tempering.preference.evaluation import dpo_pair_figures
from tempering.view.eval_episodes import accuracy_episodes


def test_spread_is_mean_and_sample_sd() -> None:
    sp = Spread((0, 1, 2), (0.4, 0.5, 0.6))
    assert sp.mean == pytest.approx(0.5)
    assert sp.sd == pytest.approx(0.1)
    assert Spread((3,), (0.7,)).sd == 0.0
    assert sp.to_json() == {"seeds": [0, 1, 2], "values": [0.4, 0.5, 0.6], "mean": sp.mean, "sd": sp.sd}


def _record() -> EvalRecord:
    answer = SampledAnswer(
        tokens=(5, 6), pieces=("1", "2"), logprobs=(-0.5, -0.1), text="12", reward=1.0, advantage=0.5
    )
    wrong = SampledAnswer(tokens=(7,), pieces=("3",), logprobs=(), text="3", reward=0.0, advantage=-0.5)
    problem = Problem(question="5+7=", answer="12")
    return EvalRecord("rl", 610, 0.5, 1.0, ((problem, (answer, wrong)),), (0.1, 0.9), (0.2, 1.0))


def test_record_metrics_are_named_as_the_evaluator_logs_them() -> None:
    assert _record().metrics() == {
        "test/accuracy": 0.5,
        "test/accuracy/ci95_low": 0.1,
        "test/accuracy/ci95_high": 0.9,
        "test/accuracy_greedy": 1.0,
        "test/accuracy_greedy/ci95_low": 0.2,
        "test/accuracy_greedy/ci95_high": 1.0,
    }


def test_accuracy_episodes_are_one_group_per_problem() -> None:
    first, second = accuracy_episodes(_record())
    assert (first["episode_id"], second["episode_id"]) == ("rl-s610-p0-g0", "rl-s610-p0-g1")
    assert first["tags"] == ["rl", "eval"]
    assert first["note"] == "expected 12"
    (turn,) = first["turns"]
    assert (turn["observation"], turn["action"], turn["ac_tokens"]) == ("5+7=", "12", [5, 6])
    assert second["turns"][0]["ac_logprobs"] is None  # the sampler reported none
    assert (first["advantage"], second["total_reward"]) == (0.5, 0.0)


def test_dpo_pair_figures() -> None:
    before = (np.array([-1.0, -2.0, -3.0, -1.0]), np.array([-2.0, -1.0, -3.0, -1.0]))
    after = (np.array([-0.5, -1.0, -3.0, -1.0]), np.array([-2.5, -1.5, -3.0, -2.0]))
    figures, ci95 = dpo_pair_figures(before, after, beta=0.1)
    # chosen > rejected: pair 0 before; pairs 0, 1 and 3 after
    assert figures["preference_accuracy_before"] == 0.25
    assert figures["preference_accuracy_after"] == 0.75
    assert figures["logprob_margin_before"] == pytest.approx(0.0)
    # delta = (chosen change) - (rejected change): 1.0, 1.5, 0 (a tie: half), 1.0
    assert figures["reward_accuracy"] == pytest.approx(3.5 / 4)
    assert figures["reward_margin"] == pytest.approx(0.1 * 3.5 / 4)
    assert ci95["reward_accuracy"] == wilson_interval(3.5, 4)
    assert all(math.isfinite(v) for v in figures.values())
