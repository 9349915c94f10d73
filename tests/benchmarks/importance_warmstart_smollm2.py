"""Importance correction on the real model, from an SFT warm start: held-out accuracy with and
without TIS under the off-policy ``async`` schedule.

The untrained SmolLM2-135M-Instruct answers no arithmetic question (``importance_smollm2.py``'s
probe), so accuracy cannot tell the arms apart from there. This script starts where
``tempering demo`` starts its RL stage:

1. SFT warm start, once (reused when ``<out>/sft`` already has its final checkpoint, or taken
   from a ``tempering demo`` run directory with ``--sft-from``: the demo's SFT stage is this one,
   seeded the same): LoRA rank
   32 on the training split of two-digit ``a+b=`` / ``a-b=`` problems (``split_problems(seed=0,
   n_test=100)``), 40 steps x 32 problems, lr 1e-3 (the demo's SFT stage). Its held-out accuracy
   is evaluated once (``<out>/sft_eval.json``) as the arms' common starting point.
2. For every RL seed and every mode (``--modes``, default ``off tis``): RL from the SFT state on
   :class:`~tempering.envs.arithmetic.ArithmeticProblems` (exact-answer reward, the same split),
   ``--steps`` steps of ``--batch`` problems x ``--group`` samples, 8 sampled tokens, the
   ``async`` schedule with 2 substeps (groups up to one step off-policy; the second minibatch of
   a step trains on tokens sampled before the first one's update), constant ``--lr``,
   ``importance=ImportanceCorrection(mode, cap=--cap)``. The RL seed is ``RLConfig.seed`` (every
   sampling request's seed); the batch order is the task's (seed 0) in every run.
3. The final RL weights' held-out accuracy: 100 problems never trained on, ``--eval-samples``
   answers each sampled at T=1 with each of ``--eval-seeds`` evaluation seeds, and one greedy
   answer each (greedy does not depend on the seed).

One JSON line per run (printed and appended to ``<out>/results.jsonl``): the accuracies, the
diagnostics averaged over the steps (``is/ratio_mean``, ``is/ratio_max``, ``is/frac_truncated``
with a correction; ``kl/sample_train_v1|v2`` in every run), the training reward per step, the
wall time. ``--summarize`` prints, per mode, the mean and sd over RL seeds of each figure from
``results.jsonl`` without training.

    nice -n 10 env TEMPERING_NUM_THREADS=1 PYTHONPATH=python:protocols .venv/bin/python \\
        tests/benchmarks/importance_warmstart_smollm2.py --out /tmp/tis --seeds 0 1 --lr 1e-3
    .venv/bin/python tests/benchmarks/importance_warmstart_smollm2.py --out /tmp/tis --summarize
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from tempering.backend import ModelConfig, close_service, load_renderer, load_tokenizer
from tempering.envs.arithmetic import ArithmeticProblems, Problem, split_problems, write_chat_jsonl
from tempering.evals.accuracy import AccuracyEvaluator
from tempering.local import ServiceClient
from tempering.recipes.stages import RecipeSession, RLStage, SFTStage, rl_stage, sft_stage
from tempering.rl import BatchPolicy
from tempering.rl.importance import ImportanceCorrection
from tempering.training import RunDir

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"  # as the demo names it (the converted copy, docs/models.md)
N_TEST = 100
LORA_RANK = 32
DIAGNOSTICS = (
    "is/ratio_mean",
    "is/ratio_max",
    "is/frac_truncated",
    "kl/sample_train_v1",
    "kl/sample_train_v2",
    "async/mean_staleness",
)


BATCH_COUNTS = ("batch/zero_variance_groups", "batch/zero_variance_samples", "batch/refill_groups")


def _sum(metrics: list[dict[str, Any]], key: str) -> float | None:
    values = [float(m[key]) for m in metrics if key in m]
    return sum(values) if values else None


def _mean(metrics: list[dict[str, Any]], key: str) -> float | None:
    values = [float(m[key]) for m in metrics if key in m]
    return round(statistics.fmean(values), 6) if values else None


async def evaluate(
    s: RecipeSession, sampler_path: str, problems: list[Problem], eval_seeds: int, samples: int
) -> dict[str, Any]:
    """Held-out accuracy sampled at T=1 over ``eval_seeds`` evaluation seeds, and greedy once."""
    renderer = load_renderer(BASE, None)
    tokenizer = load_tokenizer(BASE)
    sampler = await s.sampler(sampler_path)
    sampled: list[float] = []
    greedy = float("nan")
    for seed in range(eval_seeds):
        ev = AccuracyEvaluator(
            problems, renderer, tokenizer, num_samples=samples, seed=seed, n_report=0, greedy=seed == 0
        )
        await ev(sampler)
        record = ev.records[-1]
        sampled.append(record.accuracy)
        if seed == 0:
            greedy = record.greedy_accuracy
    return {
        "accuracy": sampled,
        "accuracy_mean": statistics.fmean(sampled),
        "accuracy_sd": statistics.stdev(sampled) if len(sampled) > 1 else 0.0,
        "greedy": greedy,
    }


async def warm_start(
    s: RecipeSession, args: argparse.Namespace, test: list[Problem]
) -> tuple[str, dict[str, Any]]:
    """The SFT state (trained now, or the one already in ``<out>/sft``) and its evaluation."""
    out: Path = args.out
    sft_dir = (args.sft_from or out) / "sft"
    final = RunDir(sft_dir).last_checkpoint() if sft_dir.exists() else None
    if args.sft_from is not None and (final is None or final.name != "final"):
        raise SystemExit(
            f"--sft-from {args.sft_from}: {sft_dir} has no final checkpoint; run `tempering demo` there first"
        )
    if final is None or final.name != "final" or final.sampler_path is None:
        train, _ = split_problems(seed=0, n_test=N_TEST)
        train_path = write_chat_jsonl(train, out / "data" / "train.jsonl")
        t0 = time.perf_counter()
        result = await sft_stage(
            s, "sft", SFTStage(args.sft_steps, 32, 1e-3),
            model=ModelConfig(base_model=BASE, lora_rank=LORA_RANK, seed=0), train_path=train_path, seed=0,
        )  # fmt: skip
        print(json.dumps({"sft_seconds": round(time.perf_counter() - t0, 1)}), flush=True)
        final = result.final
    assert final.state_path is not None
    assert final.sampler_path is not None
    cached = out / "sft_eval.json"
    if cached.exists():
        return final.state_path, json.loads(cached.read_text())
    figures = await evaluate(s, final.sampler_path, test, args.eval_seeds, args.eval_samples)
    cached.write_text(json.dumps(figures))
    return final.state_path, figures


async def rl_run(
    s: RecipeSession, args: argparse.Namespace, state: str, test: list[Problem], seed: int, mode: str
) -> dict[str, Any]:
    t0 = time.perf_counter()
    # "dynamic": no correction, the batch refilled past zero-variance groups (BatchPolicy).
    dynamic = mode == "dynamic"
    correction = "off" if dynamic else mode
    rl = await rl_stage(
        s, f"rl-{mode}-{args.schedule}-seed{seed}-lr{args.lr:g}",
        RLStage(args.steps, args.lr, num_substeps=2 if args.schedule == "async" else 1),
        dataset=ArithmeticProblems(
            base_model=BASE, seed=0, n_test=N_TEST, batch_size=args.batch, group_size=args.group,
            test_group_size=0,
        ),
        model=ModelConfig(base_model=BASE, lora_rank=LORA_RANK, init_state=state),
        max_tokens=8, seed=seed, schedule=args.schedule,
        importance=ImportanceCorrection(correction, cap=args.cap),  # pyright: ignore[reportArgumentType]
        batch=BatchPolicy(dynamic_sampling=dynamic, refill_budget=1.0),
    )  # fmt: skip
    train_seconds = time.perf_counter() - t0
    assert rl.final.sampler_path is not None
    metrics = [dict(m) for m in rl.metrics]
    return {
        "seed": seed,
        "importance": mode,
        "schedule": args.schedule,
        **{key: _sum(metrics, key) for key in BATCH_COUNTS},
        "cap": args.cap,
        "lr": args.lr,
        "steps": len(metrics),
        **{key: _mean(metrics, key) for key in DIAGNOSTICS},
        "reward": [round(float(m["env/reward/mean"]), 4) for m in metrics if "env/reward/mean" in m],
        **await evaluate(s, rl.final.sampler_path, test, args.eval_seeds, args.eval_samples),
        "train_seconds": round(train_seconds, 1),
        "seconds": round(time.perf_counter() - t0, 1),
    }


async def main_async(args: argparse.Namespace) -> None:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    _, test = split_problems(seed=0, n_test=N_TEST)
    threads = int(os.environ.get("TEMPERING_NUM_THREADS") or 1)
    service = ServiceClient(num_threads=threads, device="cpu")
    s = RecipeSession("importance-warmstart", out, service, None, progress=False)
    try:
        state, sft_figures = await warm_start(s, args, test)
        print(json.dumps({"sft": sft_figures}), flush=True)
        for seed in args.seeds:
            for mode in args.modes:
                line = await rl_run(s, args, state, test, seed, mode)
                print(json.dumps(line), flush=True)
                with (out / "results.jsonl").open("a", encoding="utf-8") as f:
                    f.write(json.dumps(line) + "\n")
    finally:
        close_service(service)


def summarize(out: Path) -> None:
    """Per (lr, mode): mean and sd over RL seeds of the accuracies and diagnostics."""
    sft = json.loads((out / "sft_eval.json").read_text())
    print(
        f"SFT start: sampled {sft['accuracy_mean']:.3f} +- {sft['accuracy_sd']:.3f} "
        f"{sft['accuracy']}, greedy {sft['greedy']:.2f}"
    )
    runs: defaultdict[tuple[float, str], list[dict[str, Any]]] = defaultdict(list)
    for line in (out / "results.jsonl").read_text().splitlines():
        run = json.loads(line)
        runs[(run["lr"], run["importance"])].append(run)
    for (lr, mode), group in sorted(runs.items()):
        parts = [f"lr {lr:g} {mode}: seeds {[r['seed'] for r in group]}"]
        for key in ("accuracy_mean", "greedy", *DIAGNOSTICS):
            values = [float(r[key]) for r in group if r.get(key) is not None]
            if values:
                sd = statistics.stdev(values) if len(values) > 1 else 0.0
                parts.append(
                    f"{key} {statistics.fmean(values):.4f} +- {sd:.4f} {[round(v, 4) for v in values]}"
                )
        print("\n  ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("/tmp/importance-warmstart"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["off", "tis"],
        choices=["off", "tis", "mis", "dynamic"],
        help="dynamic: no correction, dynamic sampling (BatchPolicy(dynamic_sampling=True))",
    )
    parser.add_argument("--schedule", default="async", choices=["sync", "async"])
    parser.add_argument(
        "--sft-steps", type=int, default=40, help="only when <out>/sft has no final checkpoint"
    )
    parser.add_argument(
        "--sft-from", type=Path, default=None,
        help="a `tempering demo` run directory: its sft/ final checkpoint is the warm start",
    )  # fmt: skip
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--cap", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--eval-seeds", type=int, default=3)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument(
        "--summarize", action="store_true", help="print the table of results.jsonl; no training"
    )
    args = parser.parse_args()
    if args.summarize:
        summarize(args.out)
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
