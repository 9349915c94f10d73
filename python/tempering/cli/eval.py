"""``tempering eval``: benchmarks against any sampling client, results to JSON and a table.

Example::

    tempering eval --benchmark gsm8k --data gsm8k_test.jsonl --limit 50 --num-samples 4
    tempering eval --benchmark gsm8k math500 --model-path tempering://run/sampler_weights/final
    tempering eval --benchmark nll --data held_out_chat.jsonl --base-url http://127.0.0.1:8000
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import attrs

from tempering.evals.benchmarks import UnknownBenchmarkError
from tempering.evals.clients import ModelSource
from tempering.evals.report import print_table, write_report
from tempering.evals.suite import EvalSuite, known_benchmarks

__all__ = ["EvalCommandConfig", "run_eval"]


@attrs.frozen(kw_only=True)
class EvalCommandConfig:
    """Evaluate a model on benchmarks: answer-graded math (``gsm8k``, ``math500``, ``aime24``,
    ``aime25``: pass@1 over ``num_samples`` seeded samples per item, with a 95% Wilson interval)
    and ``nll`` (NLL per token and bits per byte of a chat file). The model runs on the local
    engine, on a ``tempering serve`` (``base_url``) or on the hosted service (``TINKER_API_KEY``).
    Results go to ``output`` (JSON) and print as a table.
    """

    benchmark: tuple[str, ...] = ("gsm8k",)
    """Benchmarks to run (see ``--list``)."""
    data: tuple[str, ...] = ()
    """Local data instead of the hub: PATH (one benchmark) or NAME=PATH entries; a .jsonl/.json/
    .parquet file in the benchmark's schema, or tempering-assets:NAME."""
    limit: int | None = None
    """Evaluate the first LIMIT items of each benchmark."""
    num_samples: int = 1
    """Samples per item (each with its own seed)."""
    temperature: float = 0.6
    max_tokens: int = 1024
    seed: int = 0
    """The evaluation's seed; each item's and sample's seed derives from it."""
    grader_timeout_s: float = 5.0
    system_prompt: str | None = None
    base_model: str = "tempering/tiny"
    """Base model: tempering/tiny, a local model directory, or a hosted model name."""
    model_path: str | None = None
    """Saved sampler weights to evaluate (tempering://... or tinker://...) instead of the base model."""
    base_url: str | None = None
    """A tempering serve (or Tinker-compatible) server; default: hosted with TINKER_API_KEY, else local."""
    api_key: str | None = None
    """The server's API key (default $TINKER_API_KEY)."""
    renderer_name: str | None = None
    """Chat format (default: the one recommended for base_model)."""
    output: str = "eval_results.json"
    """Where the JSON results go."""

    def suite(self) -> EvalSuite:
        return EvalSuite(
            benchmarks=self.benchmark,
            data=self.data,
            limit=self.limit,
            num_samples=self.num_samples,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            seed=self.seed,
            grader_timeout_s=self.grader_timeout_s,
            system_prompt=self.system_prompt,
        )

    def source(self) -> ModelSource:
        return ModelSource(
            base_model=self.base_model,
            model_path=self.model_path,
            base_url=self.base_url,
            api_key=self.api_key,
            renderer_name=self.renderer_name,
        )


async def run_eval(config: EvalCommandConfig) -> dict[str, float]:
    """Run ``config``'s benchmarks, write the JSON results and print the table; returns every
    benchmark's metrics (``<benchmark>/<metric>``)."""
    from tempering.backend import ModelConfig

    suite = config.suite()
    source = config.source()
    evaluators = suite.build(ModelConfig(base_model=source.base_model, renderer_name=source.renderer_name))
    results: list[Any] = []
    metrics: dict[str, float] = {}
    async with source.open() as sampling_client:
        for evaluator in evaluators:
            result = await evaluator.run(sampling_client)
            results.append(result)
            metrics |= result.metrics()
    settings = attrs.asdict(suite)
    model = {
        "base_model": source.base_model,
        "model_path": source.model_path,
        "renderer": source.renderer(),
        "backend": source.backend(),
    }
    path = write_report(config.output, model=model, settings=settings, results=results)
    print_table(results, title=f"{source.model_path or source.base_model} ({source.backend()})")
    print(f"results: {path}")
    return metrics


def main(argv: list[str], tyro_cli: Any) -> int:
    """``tempering eval [flags]`` (``tyro_cli`` builds the config from ``argv``)."""
    if "--list" in argv:
        for name in known_benchmarks():
            print(name)
        return 0
    try:
        config: EvalCommandConfig = tyro_cli(EvalCommandConfig, argv, "tempering eval", _HELP)
        suite = config.suite()
    except (UnknownBenchmarkError, ValueError) as exc:
        print(f"tempering eval: {exc}", file=sys.stderr)
        return 2
    del suite
    asyncio.run(run_eval(config))
    return 0


_HELP = "evaluate a model on benchmarks (GSM8K, MATH-500, AIME, chat-file NLL) (docs/evals.md)"
