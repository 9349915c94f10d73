"""Evaluation randomness: every item of an evaluation draws from its own seed (derived from the
evaluator's seed as the RL loop derives its per-group seeds), so two problems never read the same
random stream; and the accuracies come with a Wilson interval."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import pytest
import tinker

from tempering.backend import load_tokenizer
from tempering.envs.arithmetic import split_problems
from tempering.envs.problem import Problem
from tempering.evals.accuracy import AccuracyEvaluator, item_seed, wilson_interval
from tempering.evals.reply import ReplyEvaluator
from tempering.local import ServiceClient
from tempering.renderers import get_renderer
from tempering.rl.policy import sampling_seed
from tempering_protocols import Message, Renderer, SamplingClient, Tokenizer


class _Recording:
    """A real sampling client that records the seed of every request."""

    def __init__(self, inner: SamplingClient) -> None:
        self.inner = inner
        self.seeds: list[tuple[float, int | None]] = []

    def sample(
        self, prompt: tinker.ModelInput, num_samples: int, sampling_params: tinker.SamplingParams
    ) -> object:
        self.seeds.append((sampling_params.temperature, sampling_params.seed))
        return self.inner.sample(prompt, num_samples, sampling_params)


def _renderer() -> tuple[Renderer, Tokenizer]:
    tokenizer = load_tokenizer("tempering/tiny")
    return get_renderer("chatml", tokenizer), tokenizer


def _sampler(service: ServiceClient) -> _Recording:
    return _Recording(service.create_sampling_client(base_model="tempering/tiny").result())


def test_item_seeds_are_the_rl_derivation_and_distinct() -> None:
    assert item_seed(3, "accuracy", 7) == sampling_seed(3, "eval", "accuracy", 7)
    seeds = {item_seed(0, "accuracy", p) for p in range(1000)}
    assert len(seeds) == 1000
    assert item_seed(0, "accuracy", 1) != item_seed(1, "accuracy", 1)


@pytest.mark.timeout(300)
def test_problems_never_share_draws(service: ServiceClient) -> None:
    renderer, tokenizer = _renderer()
    sampler = _sampler(service)
    # Six copies of one prompt: with one seed for every problem (the old behaviour) all six
    # would get the same four answers, token for token.
    same = [Problem("12+34=", "46")] * 6
    evaluator = AccuracyEvaluator(same, renderer, tokenizer, num_samples=4, max_tokens=8, n_report=6, seed=5)
    metrics = asyncio.run(evaluator(sampler))  # pyright: ignore[reportArgumentType]

    sampled = [seed for temperature, seed in sampler.seeds if temperature > 0]
    assert len(sampled) == 6, sampler.seeds
    assert len(set(sampled)) == 6, sampler.seeds
    answers = [tuple(a.tokens for a in answers) for _, answers in evaluator.records[-1].problems]
    assert len(set(answers)) > 1, "identical prompts drew identical samples: one random stream"
    # The same evaluator again: the same draws (a fixed seed per item, not per call).
    asyncio.run(evaluator(sampler))  # pyright: ignore[reportArgumentType]
    again = [tuple(a.tokens for a in answers) for _, answers in evaluator.records[-1].problems]
    assert again == answers
    low, high = metrics["test/accuracy/ci95_low"], metrics["test/accuracy/ci95_high"]
    assert 0.0 <= low <= metrics["test/accuracy"] <= high <= 1.0


@pytest.mark.timeout(300)
def test_reply_evaluator_seeds_every_item(service: ServiceClient) -> None:
    renderer, _ = _renderer()
    sampler = _sampler(service)
    _, test = split_problems(seed=0, n_test=5)
    items: Sequence[tuple[list[Message], str]] = [
        ([{"role": "user", "content": p.question}], p.answer) for p in test
    ]
    evaluator = ReplyEvaluator(items, renderer, max_tokens=4, temperature=1.0, seed=2)
    metrics = asyncio.run(evaluator(sampler))  # pyright: ignore[reportArgumentType]
    seeds = [seed for _, seed in sampler.seeds]
    assert len(set(seeds)) == len(items)
    assert metrics["test/exact_match/ci95_low"] <= metrics["test/exact_match"]


def test_wilson_interval() -> None:
    low, high = wilson_interval(80, 100)
    assert math.isclose(low, 0.7112, abs_tol=1e-4)
    assert math.isclose(high, 0.8666, abs_tol=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0
    assert 0.0 < wilson_interval(0, 10)[1] < 0.35
    assert wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.timeout(300)
def test_no_greedy_pass_when_asked(service: ServiceClient) -> None:
    renderer, tokenizer = _renderer()
    sampler = _sampler(service)
    _, test = split_problems(seed=0, n_test=3)
    evaluator = AccuracyEvaluator(test, renderer, tokenizer, num_samples=2, max_tokens=4, greedy=False)
    metrics = asyncio.run(evaluator(sampler))  # pyright: ignore[reportArgumentType]
    # Only the sampled requests ran; no greedy figure is made up.
    assert [t for t, _ in sampler.seeds] == [1.0] * 3
    assert "test/accuracy" in metrics
    assert not any("greedy" in k for k in metrics)
    assert math.isnan(evaluator.records[-1].greedy_accuracy)
