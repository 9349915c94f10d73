"""Graded benchmark evaluation of a sampling client (math, multiple choice, IFEval, code).

:class:`BenchmarkEvaluator` asks every item ``num_samples`` times, each sample with its own
seed (:func:`~tempering.evals.stats.item_seed` of the evaluator's seed, the benchmark, the item
index and the sample index), grades each reply with the grader of the benchmark's kind
(:mod:`tempering.evals.graders`; math: :class:`~tempering.grading.MathGrader`, answer
extraction, normalisation, math-verify equivalence under a time limit) and reports
pass@1 (the mean correctness over every sample) with a 95% Wilson interval and, with several
samples, the standard deviation of the accuracy over samples. It satisfies
``SamplingClientEvaluator``, so the SFT and RL loops can run it every ``eval_every`` steps;
:meth:`BenchmarkEvaluator.run` returns the full :class:`BenchmarkResult` (every reply).

Shapes: ``I`` items, ``S`` samples of one item.

Example::

    bench = get_benchmark("gsm8k")
    evaluator = BenchmarkEvaluator(bench, load_items(bench, limit=100), renderer, num_samples=4)
    result = await evaluator.run(sampling_client)
    result.pass_at_1, result.ci_low, result.ci_high
    await evaluator(sampling_client)   # {"gsm8k/pass@1": ..., "gsm8k/pass@1_ci_low": ..., ...}
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import attrs
import tinker

from tempering.evals.benchmarks import Benchmark, BenchmarkItem
from tempering.evals.graders import ItemGrader, item_grader
from tempering.evals.stats import item_seed, sample_std, wilson_interval
from tempering.grading import MathGrader
from tempering_protocols import Message, Renderer, SamplingClient

__all__ = ["BenchmarkEvaluator", "BenchmarkResult", "ItemResult", "SampleResult"]


@attrs.frozen
class SampleResult:
    """One graded reply: its seed, text, extracted answer, whether it is correct, its length in
    tokens, why sampling stopped, whether the grader timed out, its partial score (IFEval:
    instructions followed; code: tests passed; None for other kinds) and IFEval's loose verdict."""

    seed: int
    text: str
    extracted: str | None
    correct: bool
    tokens: int
    stop_reason: str
    timed_out: bool = False
    score: float | None = None
    loose: bool | None = None


@attrs.frozen
class ItemResult:
    """The samples of one item."""

    index: int
    id: str
    answer: str
    samples: tuple[SampleResult, ...]

    @property
    def accuracy(self) -> float:
        return sum(s.correct for s in self.samples) / len(self.samples)


@attrs.frozen
class BenchmarkResult:
    """A benchmark's figures and every reply. ``pass_at_1``: mean correctness over all
    ``items × num_samples`` replies; ``ci_low``/``ci_high``: its 95% Wilson interval;
    ``std_over_samples``: std of one pass's accuracy over the sample indices (0 with one sample)."""

    benchmark: str
    num_samples: int
    temperature: float
    max_tokens: int
    seed: int
    items: tuple[ItemResult, ...]

    @property
    def n_items(self) -> int:
        return len(self.items)

    @property
    def n_replies(self) -> int:
        return sum(len(i.samples) for i in self.items)

    @property
    def n_correct(self) -> int:
        return sum(s.correct for i in self.items for s in i.samples)

    @property
    def pass_at_1(self) -> float:
        return self.n_correct / max(self.n_replies, 1)

    @property
    def ci_low(self) -> float:
        return wilson_interval(self.n_correct, self.n_replies)[0]

    @property
    def ci_high(self) -> float:
        return wilson_interval(self.n_correct, self.n_replies)[1]

    @property
    def std_over_samples(self) -> float:
        return sample_std([[float(s.correct) for s in i.samples] for i in self.items])

    def metrics(self, prefix: str | None = None) -> dict[str, float]:
        """Scalar metrics keyed ``<prefix>/…`` (default prefix: the benchmark's name; ``""``: none)."""
        p = self.benchmark if prefix is None else prefix
        replies = [s for i in self.items for s in i.samples]
        n = max(len(replies), 1)
        figures = {
            "pass@1": self.pass_at_1,
            "pass@1_ci_low": self.ci_low,
            "pass@1_ci_high": self.ci_high,
            "pass@1_std_over_samples": self.std_over_samples,
            "no_answer": sum(s.extracted is None for s in replies) / n,
            "grader_timeouts": sum(s.timed_out for s in replies) / n,
            "truncated": sum(s.stop_reason == "length" for s in replies) / n,
            "mean_tokens": sum(s.tokens for s in replies) / n,
        }
        scores = [s.score for s in replies if s.score is not None]
        if scores:
            figures["partial_credit"] = sum(scores) / len(scores)
        loose = [s.loose for s in replies if s.loose is not None]
        if loose:
            figures["pass@1_loose"] = sum(loose) / len(loose)
        return {(f"{p}/{k}" if p else k): v for k, v in figures.items()}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the settings, the figures, and every item's replies."""
        return {
            "kind": "benchmark",
            "benchmark": self.benchmark,
            "n_items": self.n_items,
            "num_samples": self.num_samples,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "metrics": self.metrics(""),
            "items": [attrs.asdict(i, recurse=True) for i in self.items],
        }


def _check_positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    del instance
    if value < 1:
        raise ValueError(f"BenchmarkEvaluator: {attribute.name} must be at least 1, got {value}")


@attrs.define
class BenchmarkEvaluator:
    """Pass@1 of a sampling client on an answer-graded benchmark (see the module docstring).

    ``concurrency``: sampling requests in flight at once. ``system_prompt``: an optional system
    message before each problem. Each call appends its :class:`BenchmarkResult` to ``results``.
    ``grader`` grades math answers; ``item_grader``, when given, grades every reply instead of
    the default grader of the benchmark's kind (:func:`~tempering.evals.graders.item_grader`).
    """

    benchmark: Benchmark
    items: Sequence[BenchmarkItem]
    renderer: Renderer
    grader: MathGrader = attrs.field(factory=MathGrader)
    num_samples: int = attrs.field(default=1, validator=_check_positive)
    temperature: float = 1.0
    max_tokens: int = attrs.field(default=512, validator=_check_positive)
    seed: int = 0
    system_prompt: str | None = None
    concurrency: int = attrs.field(default=32, validator=_check_positive)
    results: list[BenchmarkResult] = attrs.field(factory=list[BenchmarkResult])
    item_grader: ItemGrader | None = None

    def __attrs_post_init__(self) -> None:
        if not self.items:
            raise ValueError(f"BenchmarkEvaluator({self.benchmark.name}): no items")
        if self.item_grader is None:
            self.item_grader = item_grader(self.benchmark, self.grader)

    def messages(self, item: BenchmarkItem) -> list[Message]:
        """The conversation that asks ``item``."""
        user: Message = {"role": "user", "content": self.benchmark.prompt(item)}
        if self.system_prompt:
            return [{"role": "system", "content": self.system_prompt}, user]
        return [user]

    async def run(self, sampling_client: SamplingClient) -> BenchmarkResult:
        """Sample and grade every item; the result is also appended to ``results``."""
        gate = asyncio.Semaphore(self.concurrency)
        stop = self.renderer.get_stop_sequences()

        async def one(
            index: int, item: BenchmarkItem, sample: int, prompt: tinker.ModelInput
        ) -> SampleResult:
            seed = item_seed(self.seed, self.benchmark.name, index, sample)
            params = tinker.SamplingParams(
                max_tokens=self.max_tokens, temperature=self.temperature, stop=stop, seed=seed
            )
            async with gate:
                response = await sampling_client.sample(prompt, 1, params)
            (sequence,) = response.sequences
            message, _ = self.renderer.parse_response(sequence.tokens)
            text = message["content"]
            assert self.item_grader is not None
            graded = await self.item_grader(text, item)
            return SampleResult(
                seed=seed,
                text=text,
                extracted=graded.extracted,
                correct=graded.correct,
                tokens=len(sequence.tokens),
                stop_reason=str(sequence.stop_reason),
                timed_out=graded.timed_out,
                score=graded.score,
                loose=graded.loose,
            )

        async def item_result(index: int, item: BenchmarkItem) -> ItemResult:
            prompt = self.renderer.build_generation_prompt(self.messages(item))
            samples = await asyncio.gather(*(one(index, item, s, prompt) for s in range(self.num_samples)))
            return ItemResult(index, item.id, item.answer, tuple(samples))

        items = await asyncio.gather(*(item_result(i, item) for i, item in enumerate(self.items)))
        result = BenchmarkResult(
            benchmark=self.benchmark.name,
            num_samples=self.num_samples,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            seed=self.seed,
            items=tuple(items),
        )
        self.results.append(result)
        return result

    async def __call__(self, sampling_client: SamplingClient, /) -> dict[str, float]:
        return (await self.run(sampling_client)).metrics()
