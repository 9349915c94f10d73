"""Held-out accuracy of a sampling client on question → answer problems, with independent draws
per problem and a binomial confidence interval.

- :class:`AccuracyEvaluator`: each problem answered ``num_samples`` times at ``temperature``
  and once greedily; keeps the sampled answers of a few problems (:class:`EvalRecord`) for a
  report.
- :func:`item_seed`: the sampling seed of item ``i`` of an evaluation, derived from the
  evaluator's seed as the RL loop derives its per-group seeds (:func:`tempering.rl.policy.sampling_seed`).
- :func:`wilson_interval`: the Wilson score interval of a binomial proportion.

Shapes: ``P`` problems, ``G`` samples of one problem.

Example::

    evaluator = AccuracyEvaluator(test_problems, renderer, tokenizer, num_samples=4, seed=0)
    metrics = await evaluator(sampling_client)
    metrics["test/accuracy"], metrics["test/accuracy/ci95_low"], metrics["test/accuracy/ci95_high"]
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
import tinker

from tempering.data.seeds import sampling_seed
from tempering.envs.problem import Problem, exact_match
from tempering.evals.stats import wilson_interval
from tempering_protocols import Renderer, SamplingClient, Tokenizer
from tempering_protocols.rendering import decode_text

__all__ = ["AccuracyEvaluator", "EvalRecord", "SampledAnswer", "item_seed", "wilson_interval"]


def item_seed(seed: int, kind: str, index: int) -> int:
    """The sampling seed of item ``index`` of an evaluation of kind ``kind`` seeded with ``seed``:
    ``sampling_seed(seed, "eval", kind, index)``, the RL loop's derivation (a hash of the key), so
    two items never read the same random stream, and the same item gets the same seed at every
    evaluation (checkpoints are compared on common draws).

    Example::

        item_seed(0, "accuracy", 3) != item_seed(0, "accuracy", 4)    # True
    """
    return sampling_seed(seed, "eval", kind, index)


def interval_metrics(name: str, successes: float, n: int) -> dict[str, float]:
    """``{name: mean, name/ci95_low: …, name/ci95_high: …}`` (Wilson, 95%)."""
    low, high = wilson_interval(successes, n)
    return {name: successes / max(n, 1), f"{name}/ci95_low": low, f"{name}/ci95_high": high}


@attrs.frozen
class SampledAnswer:
    """One sampled answer: its tokens with their text, the sampler's logprobs, and its reward."""

    tokens: tuple[int, ...]
    pieces: tuple[str, ...]
    logprobs: tuple[float, ...]
    text: str
    reward: float
    advantage: float


@attrs.frozen
class EvalRecord:
    """The rollouts of a few problems at one evaluation, for a report, and the accuracies with
    their 95% Wilson intervals."""

    stage: str
    step: int
    accuracy: float
    greedy_accuracy: float
    problems: tuple[tuple[Problem, tuple[SampledAnswer, ...]], ...]
    accuracy_ci95: tuple[float, float] = (0.0, 1.0)
    greedy_accuracy_ci95: tuple[float, float] = (0.0, 1.0)

    def figures(self, name: str) -> dict[str, float]:
        """``{<name>_accuracy, <name>_greedy_accuracy}``, e.g. for a recipe's ``summary.json``."""
        return {f"{name}_accuracy": self.accuracy, f"{name}_greedy_accuracy": self.greedy_accuracy}

    def intervals(self, name: str) -> dict[str, tuple[float, float]]:
        """The 95% Wilson intervals of :meth:`figures`, under the same names."""
        return {f"{name}_accuracy": self.accuracy_ci95, f"{name}_greedy_accuracy": self.greedy_accuracy_ci95}

    def metrics(self) -> dict[str, float]:
        """The accuracies with their intervals, named as :class:`AccuracyEvaluator` logs them
        (``test/accuracy``, ``test/accuracy/ci95_low``, ..., ``test/accuracy_greedy``, ...)."""
        out: dict[str, float] = {}
        for name, value, (low, high) in (
            ("test/accuracy", self.accuracy, self.accuracy_ci95),
            ("test/accuracy_greedy", self.greedy_accuracy, self.greedy_accuracy_ci95),
        ):
            out |= {name: value, f"{name}/ci95_low": low, f"{name}/ci95_high": high}
        return out


@attrs.define
class AccuracyEvaluator:
    """Held-out accuracy of a sampling client: each problem answered ``num_samples`` times at
    ``temperature`` (``test/accuracy``: the mean exact-match over all samples, i.e. the policy's
    accuracy as sampled) and once greedily (``test/accuracy_greedy``), each with its 95% Wilson
    interval (``…/ci95_low``, ``…/ci95_high``; over the ``P * G`` draws and the ``P`` greedy
    answers).

    Problem ``p``'s request is seeded with :func:`item_seed` ``(seed, "accuracy", p)``: every
    problem draws from its own random stream (its ``G`` samples are successive draws of it), the
    same at every call, so two checkpoints are compared on the same draws.

    Each call appends an :class:`EvalRecord` of the first ``n_report`` problems to ``records``,
    labelled with ``stage`` (its ``step`` is the number of calls before it; the caller maps
    calls to training steps). Satisfies ``SamplingClientEvaluator``.

    Example::

        evaluator = AccuracyEvaluator(test, renderer, tokenizer, stage="sft")
        metrics = await evaluator(sampling_client)
    """

    problems: Sequence[Problem]
    renderer: Renderer
    tokenizer: Tokenizer
    num_samples: int = 4
    temperature: float = 1.0
    max_tokens: int = 8
    n_report: int = 6
    stage: str = "eval"
    seed: int = 0
    greedy: bool = True
    """Also answer each problem greedily (``False``: no greedy pass, which does not depend on
    ``seed``; the record's greedy accuracy is NaN and the metrics have no ``test/accuracy_greedy``)."""
    records: list[EvalRecord] = attrs.field(factory=list)

    def _params(self, temperature: float, p: int) -> tinker.SamplingParams:
        return tinker.SamplingParams(
            max_tokens=self.max_tokens,
            temperature=temperature,
            stop=self.renderer.get_stop_sequences(),
            seed=item_seed(self.seed, "accuracy" if temperature > 0 else "accuracy-greedy", p),
        )

    async def __call__(self, sampling_client: SamplingClient, /) -> dict[str, float]:
        prompts = [
            self.renderer.build_generation_prompt([{"role": "user", "content": p.question}])
            for p in self.problems
        ]
        sampled_futures = [
            sampling_client.sample(m, self.num_samples, self._params(self.temperature, p))
            for p, m in enumerate(prompts)
        ]
        greedy_futures = (
            [sampling_client.sample(m, 1, self._params(0.0, p)) for p, m in enumerate(prompts)]
            if self.greedy
            else []
        )
        correct = 0.0
        n = 0
        report: list[tuple[Problem, tuple[SampledAnswer, ...]]] = []
        for p, future in zip(self.problems, sampled_futures, strict=True):
            answers = [self._answer(seq, p) for seq in (await future).sequences]
            correct += sum(a.reward for a in answers)
            n += len(answers)
            if len(report) < self.n_report:
                mean = float(np.mean([a.reward for a in answers])) if answers else 0.0
                report.append((p, tuple(attrs.evolve(a, advantage=a.reward - mean) for a in answers)))
        greedy_correct = 0.0
        for p, future in zip(self.problems if self.greedy else (), greedy_futures, strict=True):
            (seq,) = (await future).sequences
            greedy_correct += self._answer(seq, p).reward
        metrics = interval_metrics("test/accuracy", correct, n)
        nan = float("nan")
        greedy_metrics = (
            interval_metrics("test/accuracy_greedy", greedy_correct, len(self.problems))
            if self.greedy
            else {}
        )
        metrics |= greedy_metrics
        record = EvalRecord(
            self.stage,
            len(self.records),
            metrics["test/accuracy"],
            greedy_metrics.get("test/accuracy_greedy", nan),
            tuple(report),
            (metrics["test/accuracy/ci95_low"], metrics["test/accuracy/ci95_high"]),
            (
                greedy_metrics.get("test/accuracy_greedy/ci95_low", nan),
                greedy_metrics.get("test/accuracy_greedy/ci95_high", nan),
            ),
        )
        self.records.append(record)
        return metrics

    def _answer(self, seq: tinker.SampledSequence, problem: Problem) -> SampledAnswer:
        message, _ = self.renderer.parse_response(seq.tokens)
        reward = exact_match(message["content"], problem.answer)
        pieces = tuple(decode_text(self.tokenizer, [t]) for t in seq.tokens)
        logprobs = tuple(float(x) for x in (seq.logprobs or ()))
        return SampledAnswer(tuple(seq.tokens), pieces, logprobs, message["content"], reward, 0.0)
