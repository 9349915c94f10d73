"""``tempering demo`` (``make demo``): SFT warm start on arithmetic, then RL with verifiable
rewards from that checkpoint, on the local engine with the built-in tiny model, offline.

The pipeline is made of the library's own pieces; nothing here is a training loop:

1. Data: every two-digit ``a+b=`` / ``a-b=`` problem, split by a seeded shuffle into a held-out
   set (``n_test``) and the training set (:mod:`tempering.envs.arithmetic`); written as chat
   JSONL into ``<out>/data``.
2. SFT: :func:`tempering.sft.train_supervised` (full fine-tuning of ``tempering/tiny``,
   ``--sft-steps`` steps) with held-out NLL and held-out accuracy evaluators; run directory
   ``<out>/sft``.
3. RL: :func:`tempering.rl.train` starting from the SFT run's final checkpoint
   (``ModelConfig.init_state``) on :class:`~tempering.envs.arithmetic.ArithmeticProblems`
   (reward 1 for the exact answer), ``--rl-steps`` steps of ``rl_batch_size`` problems ×
   ``group_size`` samples, advantages normalised per group, learning rate decayed linearly; run
   directory ``<out>/rl``, with the rollouts logged under ``<out>/rl/trajectories``.
4. The RL weights of every periodic checkpoint (``--rl-eval-every``) and the final ones are
   evaluated like the SFT ones; ``<out>`` gets ``metrics.jsonl`` (both stages, with ``stage``
   and ``global_step``, the RL checkpoints' held-out accuracies merged into the RL lines),
   ``trajectories/eval/step-NNNNNN.jsonl`` (each evaluation's sampled answers to the first
   ``n_report`` held-out problems, by global step), ``summary.json`` (``sft_accuracy``,
   ``rl_accuracy``, ``wall_seconds``, …) and ``view.html``: the ``tempering view`` page of the
   whole directory (both stages' curves, the evaluations' answers, the RL rollouts), written
   once as a static file (docs/view.md).
5. The spread: the final SFT and RL weights are evaluated again with ``eval_seeds - 1`` more
   evaluation seeds; ``summary.json``'s ``spread`` holds each accuracy's values, mean and
   standard deviation over the ``eval_seeds`` evaluations.

Held-out accuracy is the mean exact-match of ``eval_samples`` answers per held-out problem
sampled at temperature 1 (the policy as RL samples it); greedy accuracy is recorded beside it.
Every problem draws from its own seed (:class:`~tempering.evals.accuracy.AccuracyEvaluator`),
and each accuracy comes with its 95% Wilson interval (``ci95`` in ``summary.json`` and the
summary line) and its spread over evaluation seeds (``spread``; mean ± sd in the summary line).

The RL stage alone, from the SFT checkpoint, is ``tempering rl dataset:arithmetic-demo`` (see
docs/quickstart.md).

Shapes: ``P`` problems per RL step (``rl_batch_size``), ``G`` samples per problem (``group_size``).

Example::

    tempering demo                                   # defaults: the benchmark in docs/benchmarks.md
    tempering demo --sft-steps 40 --rl-steps 4 --out /tmp/demo
    summary = asyncio.run(DemoConfig(out="/tmp/demo")())
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from tempering.backend import ModelConfig, load_tokenizer
from tempering.envs.arithmetic import ArithmeticProblems, split_problems, write_chat_jsonl
from tempering.evals.accuracy import AccuracyEvaluator
from tempering.evals.stats import Spread
from tempering.recipes.stages import RecipeSession, RLStage, SFTStage, recipe_session, rl_stage, sft_stage
from tempering.renderers import get_renderer
from tempering.rl.train import LossName
from tempering.training import RunDir
from tempering.training.schedule import ScheduleKind

__all__ = ["DemoConfig", "DemoSummary", "main"]

_BASE_MODEL = "tempering/tiny"


@attrs.frozen(kw_only=True)
class DemoConfig:
    """Sizes and budgets of the demo; calling it (``await config()``) runs it.

    The defaults are the benchmark recorded in docs/benchmarks.md; the test runs a tiny budget.
    """

    out: str | None = None
    """Run directory (replaced if it exists); default ``runs/demo-<timestamp>``."""
    seed: int = 0
    """Seeds the split, the batch order, the model's initialisation and the evaluations' sampling."""
    n_test: int = 200
    """Held-out problems (never trained on)."""
    eval_samples: int = 4
    """Answers sampled per held-out problem for the accuracy."""
    eval_seeds: int = 3
    """Evaluation seeds of the final SFT and RL weights (``seed``, ``seed + 1``, …): the spread
    of their accuracies (``spread`` in ``summary.json``)."""
    n_report: int = 5
    """Held-out problems whose sampled answers each evaluation keeps for the page."""
    sft_steps: int = 600
    """SFT steps on the training problems."""
    sft_batch_size: int = 64
    """Problems per SFT step."""
    sft_learning_rate: float = 2e-3
    """Peak learning rate of the SFT stage."""
    sft_eval_every: int = 100
    """Evaluate SFT every this many steps."""
    sft_weight_decay: float = 0.1
    """AdamW weight decay of the SFT stage: with it the tiny model learns the carry (the sudden
    rise of the accuracy curve) in about half the steps (docs/benchmarks.md#demo)."""
    rl_steps: int = 80
    """RL steps from the SFT checkpoint."""
    rl_batch_size: int = 16
    """Problems per RL step (``P``)."""
    group_size: int = 16
    """Samples per problem (``G``); the advantage is the reward minus the group's mean."""
    rl_learning_rate: float = 2e-4
    """Peak learning rate of the RL stage."""
    rl_lr_schedule: ScheduleKind = "linear"
    """``constant``, ``linear`` (decay to 0 at the last step) or ``cosine``."""
    rl_loss_fn: LossName = "importance_sampling"
    """The RL loss (docs/rl.md, Losses)."""
    rl_num_substeps: int = 1
    """Optimizer steps per RL batch (the batch is split into this many minibatches)."""
    normalize_advantages: bool = True
    """Divide each group's advantages by its reward standard deviation (GRPO-style)."""
    rl_eval_every: int = 10
    """Save the RL policy every this many steps; the demo evaluates each after the run."""
    log_trajectories: bool = True
    """Log the RL rollouts under ``<out>/rl/trajectories`` (Parquet + text; docs/rl.md)."""
    num_threads: int | None = None
    """Torch threads (process-wide); default ``$TEMPERING_NUM_THREADS``, else 1 (fastest for the
    tiny model: two threads were slower on 2 cores, see docs/benchmarks.md)."""
    progress: bool = True
    """Show the progress bars."""

    async def __call__(self) -> DemoSummary:
        return await run_demo(self)


@attrs.frozen
class DemoSummary:
    """What the demo reports: the run directory and the figures also in ``summary.json``, with
    the 95% Wilson intervals of the accuracies (``ci95``: figure name → ``(low, high)``)."""

    run_dir: Path
    sft_accuracy: float
    rl_accuracy: float
    sft_greedy_accuracy: float
    rl_greedy_accuracy: float
    wall_seconds: float
    ci95: Mapping[str, tuple[float, float]] = attrs.field(factory=dict[str, tuple[float, float]])
    spread: Mapping[str, Spread] = attrs.field(factory=dict[str, Spread])
    """Figure name → its values over the evaluation seeds, their mean and sd."""

    def line(self) -> str:
        """The final summary line."""

        def acc(name: str) -> str:
            value: float = getattr(self, name)
            low, high = self.ci95.get(name, (float("nan"), float("nan")))
            text = f"{value:.1%} [95% CI {low:.1%}-{high:.1%}"
            sp = self.spread.get(name)
            if sp is not None and len(sp.values) > 1:
                text += f"; {sp.mean:.1%} ± {sp.sd:.1%} over {len(sp.values)} eval seeds"
            return text + "]"

        return (
            f"held-out accuracy after SFT {acc('sft_accuracy')}, after RL {acc('rl_accuracy')} "
            f"(sampled at T=1; greedy {acc('sft_greedy_accuracy')} -> {acc('rl_greedy_accuracy')}) "
            f"in {self.wall_seconds:.0f} s"
        )


def _combine(stage: str, offset: int, lines: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{"stage": stage, "global_step": offset + int(line["step"]) + 1, **line} for line in lines]


def _evaluated_steps(lines: Sequence[Mapping[str, Any]]) -> list[int]:
    """The steps after which the SFT loop ran its sampling evaluators: 0, then every line that
    logged ``test/accuracy`` (that line's ``step`` is 0-based)."""
    return [0, *(int(line["step"]) + 1 for line in lines if "test/accuracy" in line)]


async def run_demo(config: DemoConfig) -> DemoSummary:
    """Run the whole demo; see the module docstring."""
    from tempering.local import ServiceClient

    if config.eval_seeds < 1:
        raise ValueError(f"DemoConfig.eval_seeds is {config.eval_seeds}; it must be at least 1")
    _check_view_extra()  # the page needs the ``view`` extra: say so before training, not after
    threads = config.num_threads
    if threads is None:
        threads = int(os.environ.get("TEMPERING_NUM_THREADS") or 1)
    service = ServiceClient(num_threads=threads, device="cpu")
    async with recipe_session("demo", config, service=service) as s:
        return await _run(config, s, threads)


def _check_view_extra() -> None:
    """Raise ``ImportError`` naming the ``view`` extra when the page cannot be written."""
    try:
        import importlib

        importlib.import_module("tempering.view")  # starlette
        from tempering.view.page import plotly_js

        plotly_js()
    except ImportError as exc:
        raise ImportError(
            f"the demo writes its page with tempering view, which needs the `view` extra ({exc}): "
            "pip install 'tempering[view]'"
        ) from exc


async def _run(config: DemoConfig, s: RecipeSession, threads: int) -> DemoSummary:
    from tempering.view import write_eval_rollouts, write_static
    from tempering.view.eval_episodes import accuracy_episodes

    out = s.run_dir
    # 1. data
    train_problems, test_problems = split_problems(seed=config.seed, n_test=config.n_test)
    train_path = write_chat_jsonl(train_problems, out / "data" / "train.jsonl")
    test_path = write_chat_jsonl(test_problems, out / "data" / "test.jsonl")
    tokenizer = load_tokenizer(_BASE_MODEL)
    renderer = get_renderer("chatml", tokenizer)

    def evaluator(stage: str, seed: int = config.seed) -> AccuracyEvaluator:
        return AccuracyEvaluator(
            test_problems, renderer, tokenizer, num_samples=config.eval_samples, stage=stage, seed=seed,
            n_report=config.n_report,
        )  # fmt: skip

    # 2. SFT (full fine-tuning from the randomly initialised tiny model)
    sft_eval = evaluator("sft")
    print(
        f"tempering demo: SFT, {config.sft_steps} steps of {config.sft_batch_size} problems -> {out / 'sft'}"
    )
    model = ModelConfig(base_model=_BASE_MODEL, lora_rank=0, seed=config.seed)
    sft = await sft_stage(
        s, "sft", SFTStage.of(config, "sft_"), model=model, train_path=train_path, test_path=test_path,
        seed=config.seed, sampling_evaluators=[sft_eval],
    )  # fmt: skip
    steps = _evaluated_steps(sft.metrics)
    sft_records = [attrs.evolve(r, step=st) for r, st in zip(sft_eval.records, steps, strict=False)]

    # 3. RL from the SFT checkpoint. Periodic checkpoints with sampler weights every
    # ``rl_eval_every`` steps: the demo evaluates them after the run with the SFT stage's
    # evaluator (same problems, same seeds, answers kept for the page); the loop's own
    # held-out pass runs once, at the end.
    task = ArithmeticProblems(
        base_model=_BASE_MODEL, seed=config.seed, n_test=config.n_test, batch_size=config.rl_batch_size,
        group_size=config.group_size, test_group_size=config.eval_samples,
    )  # fmt: skip
    print(
        f"tempering demo: RL, {config.rl_steps} steps of {config.rl_batch_size} problems x "
        f"{config.group_size} samples -> {out / 'rl'}"
    )
    rl = await rl_stage(
        s, "rl", RLStage.of(config, "rl_", eval_every=0, save_every=config.rl_eval_every), dataset=task,
        model=ModelConfig(base_model=_BASE_MODEL, init_state=sft.final.state_path), max_tokens=8,
        normalize_advantages=config.normalize_advantages, log_trajectories=config.log_trajectories,
    )  # fmt: skip

    # 4. held-out evaluation of the RL weights: every periodic checkpoint, then the final ones
    rl_eval = evaluator("rl")
    rl_samplers: dict[int, str] = {}
    for record in RunDir(out / "rl").checkpoints():
        if record.sampler_path is None or record.step in rl_samplers:
            continue
        await rl_eval(await s.sampler(record.sampler_path))
        rl_samplers[record.step] = record.sampler_path
    rl_records = [
        attrs.evolve(r, step=config.sft_steps + st)
        for r, st in zip(rl_eval.records, rl_samplers, strict=True)
    ]
    sft_final, rl_final = sft_records[-1], rl_records[-1]

    # 5. the spread: the final weights evaluated again with more evaluation seeds
    seeds = tuple(config.seed + k for k in range(config.eval_seeds))
    spread: dict[str, Spread] = {}
    for stage, first, path in (
        ("sft", sft_final, sft.final.sampler_path),
        ("rl", rl_final, rl_samplers[max(rl_samplers)]),
    ):
        records = [first]
        for seed in seeds[1:]:
            again = evaluator(stage, seed)
            await again(await s.sampler(path))
            records.append(again.records[-1])
        spread[f"{stage}_accuracy"] = Spread(seeds, tuple(r.accuracy for r in records))
        spread[f"{stage}_greedy_accuracy"] = Spread(seeds, tuple(r.greedy_accuracy for r in records))

    # 6. metrics.jsonl (the RL checkpoints' accuracies merged into the RL lines), the
    # evaluations' answers, summary.json, and the page
    lines = _combine("sft", 0, sft.metrics) + _combine("rl", config.sft_steps, list(rl.metrics))
    rl_lines = {line["global_step"]: line for line in lines if line["stage"] == "rl"}
    for r in rl_records:
        if r.step in rl_lines:
            rl_lines[r.step].update(r.metrics())
    with (out / "metrics.jsonl").open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    for r in [*sft_records, *rl_records]:
        write_eval_rollouts(out, r.step, accuracy_episodes(r))
    figures = sft_final.figures("sft") | rl_final.figures("rl")
    ci95 = sft_final.intervals("sft") | rl_final.intervals("rl")
    extra = {
        "n_test": config.n_test,
        "eval_samples": config.eval_samples,
        "torch_threads": threads,
        "spread": {k: v.to_json() for k, v in spread.items()},
    }
    result = s.finish(figures, extra, ci95=ci95)
    write_static([out], out / "view.html", per_step=max(20, config.n_report * config.eval_samples))
    return DemoSummary(
        run_dir=out, **figures, wall_seconds=result.figures["wall_seconds"], ci95=ci95, spread=spread
    )


def main(config: DemoConfig) -> int:
    """Run the demo, print the summary line and the run directory; the CLI's entry point."""
    import asyncio
    import sys

    try:
        _check_view_extra()
    except ImportError as exc:
        print(f"tempering demo: {exc}", file=sys.stderr)
        return 1
    summary = asyncio.run(run_demo(config))
    print(summary.line())
    print(f"run directory: {summary.run_dir}")
    print(f"page: {summary.run_dir / 'view.html'} (or: tempering view {summary.run_dir})")
    return 0
