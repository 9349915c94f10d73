"""``tempering eval``: benchmarks against any sampling client, results to JSON and a table.

Example::

    tempering eval --benchmark gsm8k --data gsm8k_test.jsonl --limit 50 --num-samples 4
    tempering eval --benchmark gsm8k math500 --model-path tempering://run/sampler_weights/final
    tempering eval --benchmark nll --data held_out_chat.jsonl --base-url http://127.0.0.1:8000
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any

import attrs
import tyro

from tempering.cli.verifiers import VerifiersChoice
from tempering.evals.benchmarks import UnknownBenchmarkError
from tempering.evals.clients import ModelSource
from tempering.evals.report import print_table, write_report
from tempering.evals.suite import EvalSuite, known_benchmarks

__all__ = ["EvalCommandConfig", "run_eval"]


@attrs.frozen(kw_only=True)
class EvalCommandConfig(EvalSuite, ModelSource):
    """Evaluate a model on benchmarks: graded ones (math: ``gsm8k``, ``math500``, ``aime24``,
    ``aime25``; instruction following: ``ifeval``; multiple choice: ``mmlu_pro``, ``gpqa``,
    ``supergpqa``, ``mmlu_redux``; code in a sandbox: ``mbpp``; pass@1 over ``num_samples``
    seeded samples per item, with a 95% Wilson interval), ``nll`` (NLL per token and bits
    per byte of a chat file) and ``inspect:TASK`` (any inspect-ai task: a registered name or
    ``FILE.py@TASK``; its log goes to ``inspect/`` beside ``output``). The model runs on the
    local engine, on a ``tempering serve`` (``base_url``) or on the hosted service
    (``TINKER_API_KEY``).
    Results go to ``output`` (JSON) and print as a table. The suite's fields are
    :class:`~tempering.evals.suite.EvalSuite`'s, the model's
    :class:`~tempering.evals.clients.ModelSource`'s.
    """

    benchmarks: Annotated[tuple[str, ...], tyro.conf.arg(aliases=("--benchmark",))] = ("gsm8k",)  # pyright: ignore[reportIncompatibleVariableOverride]
    """Benchmarks to run (tempering eval --list)."""
    output: str = "eval_results.json"
    """Where the JSON results go."""

    def suite(self) -> EvalSuite:
        return EvalSuite(**{f.name: getattr(self, f.name) for f in attrs.fields(EvalSuite)})

    def source(self) -> ModelSource:
        return ModelSource(**{f.name: getattr(self, f.name) for f in attrs.fields(ModelSource)})


async def run_eval(
    config: EvalCommandConfig, *, verifiers: VerifiersChoice | None = None
) -> dict[str, float]:
    """Run ``config``'s benchmarks (and the ``verifiers`` env: its eval dataset, ``limit`` rows,
    ``num_samples`` rollouts each), write the JSON results and print the table; returns every
    benchmark's metrics (``<benchmark>/<metric>``)."""
    from tempering.backend import ModelConfig, load_renderer

    suite = config.suite()
    source = config.source()
    model_config = ModelConfig(base_model=source.base_model, renderer_name=source.renderer_name)
    evaluators = suite.build(model_config, log_dir=str(Path(config.output).parent))
    results: list[Any] = []
    metrics: dict[str, float] = {}
    async with source.open() as sampling_client:
        for evaluator in evaluators:
            outcome = await evaluator.run(sampling_client)
            for result in outcome if isinstance(outcome, list) else [outcome]:  # inspect: one per task
                results.append(result)
                metrics |= result.metrics()
        if verifiers is not None:
            from tempering.rl.verifiers_eval import evaluate_verifiers, print_verifiers_table

            env_result = await evaluate_verifiers(
                sampling_client,
                load_renderer(source.base_model, source.renderer_name),
                verifiers.env,
                verifiers.args,
                n=suite.limit,
                group_size=suite.num_samples,
                max_tokens=suite.max_tokens,
                temperature=suite.temperature,
                seed=suite.seed,
            )
            results.append(env_result)
            metrics |= env_result.metrics()
            print_verifiers_table(env_result)
    settings = attrs.asdict(suite)
    model = {
        "base_model": source.base_model,
        "model_path": source.model_path,
        "renderer": source.renderer(),
        "backend": source.backend(),
    }
    if verifiers is not None:
        settings["verifiers_env"], settings["verifiers_env_args"] = verifiers.env, verifiers.args
    path = write_report(config.output, model=model, settings=settings, results=results)
    benchmarks = [r for r in results if getattr(r, "kind", "") != "verifiers"]
    if benchmarks:
        print_table(benchmarks, title=f"{source.model_path or source.base_model} ({source.backend()})")
    print(f"results: {path}")
    return metrics


def main(argv: list[str], tyro_cli: Any) -> int:
    """``tempering eval [flags]`` (``tyro_cli`` builds the config from ``argv``); with
    ``--verifiers-env NAME`` (:mod:`tempering.cli.verifiers`) that env too, and no benchmark
    unless ``--benchmark`` is given."""
    from tempering.cli.verifiers import split_flags
    from tempering.envs.verifiers_env import VerifiersMissingError

    if "--list" in argv:
        for name in known_benchmarks():
            print(name)
        return 0
    try:
        choice, argv = split_flags(argv)
        if choice is not None:
            choice.check()
            if not any(a.split("=", 1)[0] in ("--benchmark", "--benchmarks") for a in argv):
                argv = ["--benchmarks", *argv]  # an empty list: the env alone
        config: EvalCommandConfig = tyro_cli(EvalCommandConfig, argv, "tempering eval", _HELP)
    except (UnknownBenchmarkError, ValueError, VerifiersMissingError) as exc:  # names, data entries, the env
        print(f"tempering eval: {exc}", file=sys.stderr)
        return 2
    asyncio.run(run_eval(config, verifiers=choice))
    return 0


_HELP = (
    "evaluate a model on benchmarks (GSM8K, MATH-500, AIME, IFEval, MMLU-Pro, GPQA, SuperGPQA, "
    "MMLU-Redux, MBPP, chat-file NLL) (docs/evals.md), or on an installed verifiers environment: "
    "--verifiers-env NAME [--verifiers-env-args JSON], --limit rows, --num-samples rollouts each "
    "(docs/verifiers.md)"
)
