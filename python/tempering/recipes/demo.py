"""``tempering demo`` (``make demo``): SFT warm start on arithmetic, then RL with verifiable
rewards from that checkpoint, on the local engine, offline: LoRA on the real
SmolLM2-135M-Instruct by default (``--model smollm2``), or full fine-tuning of the built-in tiny
model from random weights (``--model tiny``, the fast path the tests use). Each model has its own
sizes and budgets (:data:`PRESETS`: each model's :class:`DemoSizes`, its stages complete); a
flag given wins over the preset. The stages are nested flags (``--sft.steps``, ``--rl.batch-size``;
the flat ``--sft-steps``, ``--rl-batch-size`` as before).

The pipeline is made of the library's own pieces; nothing here is a training loop:

1. Data: every two-digit ``a+b=`` / ``a-b=`` problem, split by a seeded shuffle into a held-out
   set (``n_test``) and the training set (:mod:`tempering.envs.arithmetic`); written as chat
   JSONL into ``<out>/data``.
2. SFT: :func:`tempering.sft.train_supervised` (``--sft.steps`` steps, or ``--sft-steps``; LoRA, or full
   fine-tuning with ``--lora-rank 0``) with held-out NLL and held-out accuracy evaluators, the
   latter first before any step (the untrained model: ``base_accuracy``); run directory
   ``<out>/sft``.
3. RL: :func:`tempering.rl.train` starting from the SFT run's final checkpoint
   (``ModelConfig.init_state``) on :class:`~tempering.envs.arithmetic.ArithmeticProblems`
   (reward 1 for the exact answer), ``--rl.steps`` steps of ``rl.batch_size`` problems ×
   ``group_size`` samples, advantages normalised per group, learning rate decayed linearly; run
   directory ``<out>/rl``, with the rollouts logged under ``<out>/rl/trajectories`` (the loop
   has no test set: the demo evaluates its checkpoints itself, step 4).
4. The RL weights of every periodic checkpoint (``--rl.eval-every``) and the final ones are
   evaluated like the SFT ones; ``<out>`` gets ``metrics.jsonl`` (both stages, with ``stage``
   and ``global_step``, the RL checkpoints' held-out accuracies merged into the RL lines),
   ``trajectories/eval/step-NNNNNN.jsonl`` (each evaluation's sampled answers to the first
   ``n_report`` held-out problems, by global step), ``summary.json`` (``sft_accuracy``,
   ``rl_accuracy``, ``wall_seconds``, …) and ``view.html``: the ``tempering view`` page of the
   whole directory (both stages' curves, the evaluations' answers, the RL rollouts), written
   once as a static file (docs/view.md).
5. The spread: the untrained model and the final SFT and RL weights are evaluated again with
   ``eval_seeds - 1`` more evaluation seeds (sampled answers only: greedy ones do not depend
   on the seed); ``summary.json``'s ``spread`` holds each accuracy's values, mean and standard
   deviation over the ``eval_seeds`` evaluations.

Held-out accuracy is the mean exact-match of ``eval_samples`` answers per held-out problem
sampled at temperature 1 (the policy as RL samples it); greedy accuracy is recorded beside it.
Every problem draws from its own seed (:class:`~tempering.evals.accuracy.AccuracyEvaluator`),
and each accuracy comes with its 95% Wilson interval (``ci95`` in ``summary.json`` and the
summary line) and its spread over evaluation seeds (``spread``; mean ± sd in the summary line).

The RL stage alone, from the SFT checkpoint, is ``tempering rl dataset:arithmetic-demo`` (see
docs/quickstart.md).

Shapes: ``P`` problems per RL step (``rl.batch_size``), ``G`` samples per problem (``group_size``).

Example::

    tempering demo                                   # SmolLM2-135M-Instruct: docs/benchmarks.md#demo
    tempering demo --model tiny --sft-steps 40 --rl-steps 4 --out /tmp/demo
    summary = asyncio.run(DemoConfig(model="tiny", out="/tmp/demo", rl=DemoRL(steps=4))())
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from tempering.backend import ModelConfig, load_renderer, load_tokenizer
from tempering.envs.arithmetic import ArithmeticProblems, split_problems, write_chat_jsonl
from tempering.evals.accuracy import AccuracyEvaluator
from tempering.evals.stats import Spread
from tempering.losses import RLLossName
from tempering.recipes.stages import (
    RecipeSession,
    RLStage,
    SFTStage,
    at_least,
    recipe_session,
    rl_stage,
    sft_stage,
    stage_field,
    valid_learning_rate,
)
from tempering.training import RunDir
from tempering.training.schedule import ScheduleKind

__all__ = ["PRESETS", "DemoConfig", "DemoModel", "DemoRL", "DemoSFT", "DemoSizes", "DemoSummary", "main"]

DemoModel = Literal["smollm2", "tiny"]
"""The demo's models: the real SmolLM2-135M-Instruct (LoRA) or the built-in tiny model."""


@attrs.frozen(kw_only=True)
class DemoSizes:
    """One model's demo: its base model and every size and budget :class:`DemoConfig` leaves
    unset (:data:`PRESETS`), its stages complete (``sizes.sft.steps``, ``sizes.rl.batch_size``;
    the RL stage's ``save_every`` is the period of the checkpoints the demo evaluates)."""

    base_model: str
    lora_rank: int
    n_test: int
    eval_samples: int
    group_size: int
    num_threads: int
    """Torch threads when neither ``num_threads`` nor ``$TEMPERING_NUM_THREADS`` says."""
    sft: SFTStage
    rl: RLStage


PRESETS: Mapping[str, DemoSizes] = {
    # The real model: the benchmark in docs/benchmarks.md#demo (under 10 minutes on 2 cores).
    "smollm2": DemoSizes(
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct", lora_rank=32, n_test=100, eval_samples=4,
        group_size=8, num_threads=2, sft=SFTStage(40, 32, 1e-3, eval_every=0, weight_decay=0.0),
        rl=RLStage(8, 1e-4, lr_schedule="linear", save_every=8, batch_size=8),
    ),
    # The tiny model from random weights, full fine-tuning: two threads were slower than one on
    # 2 cores (docs/benchmarks.md).
    "tiny": DemoSizes(
        base_model="tempering/tiny", lora_rank=0, n_test=200, eval_samples=4,
        group_size=16, num_threads=1, sft=SFTStage(600, 64, 2e-3, eval_every=100, weight_decay=0.1),
        rl=RLStage(80, 2e-4, lr_schedule="linear", save_every=10, batch_size=16),
    ),
}  # fmt: skip
"""Each model's sizes and budgets (``--model``); a flag given on the command line wins."""


def _given(stage: attrs.AttrsInstance) -> dict[str, Any]:
    return {k: v for k, v in attrs.asdict(stage).items() if v is not None}


@attrs.frozen
class DemoSFT:
    """The demo's SFT stage as flags (``--sft.steps``, or the flat ``--sft-steps``): a setting
    left unset takes the model's preset (:data:`PRESETS`); :meth:`over` is the complete stage."""

    steps: int | None = attrs.field(default=None, validator=at_least(1))
    """SFT steps on the training problems."""
    batch_size: int | None = attrs.field(default=None, validator=at_least(1))
    """Problems per SFT step."""
    learning_rate: float | None = attrs.field(default=None, validator=valid_learning_rate)
    """Peak learning rate of the SFT stage."""
    eval_every: int | None = attrs.field(default=None, validator=at_least(0))
    """Evaluate SFT every this many steps (0: before and after only)."""
    weight_decay: float | None = None
    """AdamW weight decay of the SFT stage (on the tiny model it learns the carry in about half
    the steps, docs/benchmarks.md#demo)."""

    def over(self, preset: SFTStage) -> SFTStage:
        """``preset`` with every setting given here in its place."""
        return attrs.evolve(preset, **_given(self))


@attrs.frozen
class DemoRL:
    """The demo's RL stage as flags (``--rl.steps``, or the flat ``--rl-steps``): a setting left
    unset takes the model's preset (:data:`PRESETS`); :meth:`over` is the complete stage."""

    steps: int | None = attrs.field(default=None, validator=at_least(1))
    """RL steps from the SFT checkpoint."""
    batch_size: int | None = attrs.field(default=None, validator=at_least(1))
    """Problems per RL step (``P``)."""
    learning_rate: float | None = attrs.field(default=None, validator=valid_learning_rate)
    """Peak learning rate of the RL stage."""
    eval_every: int | None = attrs.field(default=None, validator=at_least(0))
    """Save the RL policy every this many steps; the demo evaluates each after the run (the
    stage's ``save_every``)."""
    lr_schedule: ScheduleKind = "linear"
    """``constant``, ``linear`` (decay to 0 at the last step) or ``cosine``."""
    loss_fn: RLLossName = "importance_sampling"
    """The RL loss (docs/rl.md, Losses)."""
    num_substeps: int = attrs.field(default=1, validator=at_least(1))
    """Optimizer steps per RL batch (the batch is split into this many minibatches)."""

    def over(self, preset: RLStage) -> RLStage:
        """``preset`` with every setting given here in its place."""
        given = _given(self)
        if "eval_every" in given:
            given["save_every"] = given.pop("eval_every")
        return attrs.evolve(preset, **given)


@attrs.frozen(kw_only=True)
class DemoConfig:
    """Sizes and budgets of the demo; calling it (``await config()``) runs it.

    The defaults are the benchmark recorded in docs/benchmarks.md; the test runs a tiny budget.
    """

    model: DemoModel = "smollm2"
    """``smollm2``: the real model, HuggingFaceTB/SmolLM2-135M-Instruct, LoRA (the main job;
    pulled on first use, docs/models.md); ``tiny``: the built-in 0.85M-parameter model from random
    weights, full fine-tuning (the fast path the tests use). Every size below left unset takes
    this model's preset (:data:`PRESETS`)."""
    out: str | None = None
    """Run directory (replaced if it exists); default ``runs/demo-<timestamp>``."""
    seed: int = 0
    """Seeds the split, the batch order, the model's initialisation and the evaluations' sampling."""
    n_test: int | None = None
    """Held-out problems (never trained on)."""
    eval_samples: int | None = None
    """Answers sampled per held-out problem for the accuracy."""
    eval_seeds: int = 3
    """Evaluation seeds of the untrained, final SFT and final RL weights (``seed``, ``seed + 1``,
    …): the spread of their accuracies (``spread`` in ``summary.json``)."""
    n_report: int = 5
    """Held-out problems whose sampled answers each evaluation keeps for the page."""
    lora_rank: int | None = None
    """LoRA rank (0: full fine-tuning)."""
    sft: DemoSFT = stage_field(DemoSFT())
    """The SFT stage (``--sft.steps`` or ``--sft-steps``, ``--sft.batch-size``, ...)."""
    rl: DemoRL = stage_field(DemoRL())
    """The RL stage (``--rl.steps`` or ``--rl-steps``, ``--rl.batch-size``, ``--rl.eval-every``, ...)."""
    group_size: int | None = None
    """Samples per problem (``G``); the advantage is the reward minus the group's mean."""
    normalize_advantages: bool = True
    """Divide each group's advantages by its reward standard deviation (GRPO-style)."""
    log_trajectories: bool = True
    """Log the RL rollouts under ``<out>/rl/trajectories`` (Parquet + text; docs/rl.md)."""
    num_threads: int | None = None
    """Torch threads (process-wide); default ``$TEMPERING_NUM_THREADS``, else the model's preset
    (2 for smollm2; 1 for tiny: two threads were slower on 2 cores, see docs/benchmarks.md)."""
    progress: bool = True
    """Show the progress bars."""

    async def __call__(self) -> DemoSummary:
        return await run_demo(self)

    def sizes(self) -> DemoSizes:
        """The model's preset with every size this config sets put in its place."""
        if self.model not in PRESETS:
            raise ValueError(f"DemoConfig.model is {self.model!r}; it must be one of {sorted(PRESETS)}")
        preset = PRESETS[self.model]
        given = {
            f.name: getattr(self, f.name)
            for f in attrs.fields(DemoSizes)
            if f.name not in ("sft", "rl") and getattr(self, f.name, None) is not None
        }
        for name in ("n_test", "eval_samples", "group_size", "num_threads"):
            if given.get(name, 1) < 1:
                raise ValueError(f"DemoConfig.{name} is {given[name]}; it must be at least 1")
        return attrs.evolve(preset, **given, sft=self.sft.over(preset.sft), rl=self.rl.over(preset.rl))


@attrs.frozen
class DemoSummary:
    """What the demo reports: the run directory and the figures also in ``summary.json``, with
    the 95% Wilson intervals of the accuracies (``ci95``: figure name → ``(low, high)``)."""

    run_dir: Path
    base_accuracy: float
    """The untrained model's (the SFT stage's evaluation at step 0)."""
    base_greedy_accuracy: float
    sft_accuracy: float
    rl_accuracy: float
    sft_greedy_accuracy: float
    rl_greedy_accuracy: float
    wall_seconds: float
    ci95: Mapping[str, tuple[float, float]] = attrs.field(factory=dict[str, tuple[float, float]])
    spread: Mapping[str, Spread] = attrs.field(factory=dict[str, Spread])
    """Figure name → its values over the evaluation seeds, their mean and sd."""

    def line(self) -> str:
        """The final summary line: each accuracy with its 95% interval and, where it was
        evaluated on several seeds, its spread (``± sd``) only where the values differ (greedy
        accuracies are evaluated once: they do not depend on the seed)."""

        def acc(name: str) -> str:
            value: float = getattr(self, name)
            low, high = self.ci95.get(name, (float("nan"), float("nan")))
            text = f"{value:.1%} [95% CI {low:.1%}-{high:.1%}"
            sp = self.spread.get(name)
            if sp is not None and len(set(sp.values)) > 1:  # a spread only where it varies
                text += f"; {sp.mean:.1%} ± {sp.sd:.1%} over {len(sp.values)} eval seeds"
            elif sp is not None and len(sp.values) > 1:
                text += f"; the same over {len(sp.values)} eval seeds"
            return text + "]"

        return (
            f"held-out accuracy untrained {acc('base_accuracy')}, after SFT {acc('sft_accuracy')}, "
            f"after RL {acc('rl_accuracy')} (sampled at T=1); greedy {acc('base_greedy_accuracy')} -> "
            f"{acc('sft_greedy_accuracy')} -> {acc('rl_greedy_accuracy')}; in {self.wall_seconds:.0f} s"
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
    sizes = config.sizes()
    _check_view_extra()  # the page needs the ``view`` extra: say so before training, not after
    threads = config.num_threads
    if threads is None:
        threads = int(os.environ.get("TEMPERING_NUM_THREADS") or sizes.num_threads)
    service = ServiceClient(num_threads=threads, device="cpu")
    async with recipe_session("demo", config, service=service) as s:
        return await _run(config, sizes, s, threads)


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


async def _run(config: DemoConfig, z: DemoSizes, s: RecipeSession, threads: int) -> DemoSummary:
    from tempering.view import write_eval_rollouts, write_static
    from tempering.view.eval_episodes import accuracy_episodes

    out = s.run_dir
    # 1. data
    train_problems, test_problems = split_problems(seed=config.seed, n_test=z.n_test)
    train_path = write_chat_jsonl(train_problems, out / "data" / "train.jsonl")
    test_path = write_chat_jsonl(test_problems, out / "data" / "test.jsonl")
    tokenizer = load_tokenizer(z.base_model)
    renderer = load_renderer(z.base_model, None)  # the model's recommended chat format

    def evaluator(stage: str, seed: int = config.seed, greedy: bool = True) -> AccuracyEvaluator:
        return AccuracyEvaluator(
            test_problems, renderer, tokenizer, num_samples=z.eval_samples, stage=stage, seed=seed,
            n_report=config.n_report, greedy=greedy,
        )  # fmt: skip

    # 2. SFT (LoRA on the real model; full fine-tuning of the randomly initialised tiny model);
    # its evaluation at step 0 is the untrained model's
    sft_eval = evaluator("sft")
    print(
        f"tempering demo: {z.base_model}; SFT, {z.sft.steps} steps of {z.sft.batch_size} problems "
        f"-> {out / 'sft'}"
    )
    model = ModelConfig(base_model=z.base_model, lora_rank=z.lora_rank, seed=config.seed)
    sft = await sft_stage(
        s, "sft", z.sft, model=model, train_path=train_path, test_path=test_path,
        seed=config.seed, sampling_evaluators=[sft_eval],
    )  # fmt: skip
    steps = _evaluated_steps(sft.metrics)
    sft_records = [attrs.evolve(r, step=st) for r, st in zip(sft_eval.records, steps, strict=False)]

    # 3. RL from the SFT checkpoint. Periodic checkpoints with sampler weights every
    # ``rl.eval_every`` steps (the stage's ``save_every``): the demo evaluates them after the run
    # with the SFT stage's evaluator (same problems, same seeds, answers kept for the page), so
    # the loop has no held-out pass of its own (no test set).

    task = ArithmeticProblems(
        base_model=z.base_model, seed=config.seed, n_test=z.n_test, batch_size=z.rl.batch_size,
        group_size=z.group_size, test_group_size=0,
    )  # fmt: skip
    print(
        f"tempering demo: RL, {z.rl.steps} steps of {z.rl.batch_size} problems x "
        f"{z.group_size} samples -> {out / 'rl'}"
    )
    rl = await rl_stage(
        s, "rl", z.rl, dataset=task,
        model=ModelConfig(base_model=z.base_model, lora_rank=z.lora_rank, init_state=sft.final.state_path),
        max_tokens=8,
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
        attrs.evolve(r, step=z.sft.steps + st) for r, st in zip(rl_eval.records, rl_samplers, strict=True)
    ]
    base, sft_final, rl_final = sft_records[0], sft_records[-1], rl_records[-1]

    # 5. the spread: the untrained and the final weights evaluated again with more evaluation seeds
    seeds = tuple(config.seed + k for k in range(config.eval_seeds))
    spread: dict[str, Spread] = {}
    for stage, first, path in (
        ("base", base, None),
        ("sft", sft_final, sft.final.sampler_path),
        ("rl", rl_final, rl_samplers[max(rl_samplers)]),
    ):
        records = [first]
        for seed in seeds[1:]:
            again = evaluator(stage, seed, greedy=False)  # greedy answers do not depend on the seed
            sampler = await (
                s.service.create_sampling_client(base_model=z.base_model) if path is None else s.sampler(path)
            )
            await again(sampler)
            records.append(again.records[-1])
        spread[f"{stage}_accuracy"] = Spread(seeds, tuple(r.accuracy for r in records))
        spread[f"{stage}_greedy_accuracy"] = Spread(seeds[:1], (first.greedy_accuracy,))

    # 6. metrics.jsonl (the RL checkpoints' accuracies merged into the RL lines), the
    # evaluations' answers, summary.json, and the page
    lines = _combine("sft", 0, sft.metrics) + _combine("rl", z.sft.steps, list(rl.metrics))
    rl_lines = {line["global_step"]: line for line in lines if line["stage"] == "rl"}
    for r in rl_records:
        if r.step in rl_lines:
            rl_lines[r.step].update(r.metrics())
    with (out / "metrics.jsonl").open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    for r in [*sft_records, *rl_records]:
        write_eval_rollouts(out, r.step, accuracy_episodes(r))
    figures = base.figures("base") | sft_final.figures("sft") | rl_final.figures("rl")
    ci95 = base.intervals("base") | sft_final.intervals("sft") | rl_final.intervals("rl")
    extra = {
        "model": config.model,
        "base_model": z.base_model,
        "n_test": z.n_test,
        "eval_samples": z.eval_samples,
        "torch_threads": threads,
        "spread": {k: v.to_json() for k, v in spread.items()},
    }
    result = s.finish(figures, extra, ci95=ci95)
    write_static([out], out / "view.html", per_step=max(20, config.n_report * z.eval_samples))
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
