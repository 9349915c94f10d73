"""Importance correction on the real model: the trainer/sampler ratio and what TIS does with it.

SmolLM2-135M-Instruct (``smollm2-135m-instruct``, converted locally), the shipped arithmetic task
(``ArithmeticTask``), LoRA rank 8, a constant learning rate (``--lr``, default 1e-4), 8 questions
x 4 samples per step, 24 sampled tokens, the ``async`` schedule (groups up to one step
off-policy, 2 substeps, so most minibatches train on tokens sampled by older weights), seeds
given on the command line; each seed runs
without a correction and with ``ImportanceCorrection("tis", cap=2.0)``. Per run one JSON line:
the diagnostics averaged over the steps (``is/ratio_mean``, ``is/ratio_max``,
``is/frac_truncated``, the sampler/trainer KL ``kl/sample_train_v1``), the training reward per
step, the held-out ``test/correct`` after the last step and the wall time.

    nice -n 10 .venv/bin/python tests/benchmarks/importance_smollm2.py --steps 4 --seeds 0 1

The untrained model answers no held-out question, so this probe measures the diagnostics only;
held-out accuracy with and without the correction, from an SFT warm start, is
``importance_warmstart_smollm2.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from tempering.backend import ModelConfig
from tempering.envs.tasks import ArithmeticTask
from tempering.rl.importance import ImportanceCorrection
from tempering.rl.train import RLConfig, train
from tempering.training import AdamConfig, LRSchedule, RunConfig


def _mean(metrics: list[dict[str, float]], key: str) -> float | None:
    values = [float(m[key]) for m in metrics if key in m]
    return round(statistics.fmean(values), 4) if values else None


def run(out: Path, seed: int, mode: str, steps: int, lr: float) -> dict[str, object]:
    config = RLConfig(
        run=RunConfig(
            log_dir=str(out / f"{mode}-{seed}-{lr:g}"), save_every=0, eval_every=steps, progress=False
        ),
        dataset=ArithmeticTask(batch_size=8, group_size=4, seed=seed),
        model=ModelConfig(base_model="smollm2-135m-instruct", lora_rank=8, seed=seed),
        adam=AdamConfig(learning_rate=lr, schedule=LRSchedule("constant")),
        num_steps=steps,
        max_tokens=24,
        seed=seed,
        schedule="async",
        num_substeps=2,
        importance=ImportanceCorrection(mode, cap=2.0),  # pyright: ignore[reportArgumentType]
    )
    t0 = time.perf_counter()
    metrics = asyncio.run(train(config)).metrics
    return {
        "seed": seed,
        "importance": mode,
        "lr": lr,
        "steps": len(metrics),
        "is/ratio_mean": _mean(metrics, "is/ratio_mean"),
        "is/ratio_max": _mean(metrics, "is/ratio_max"),
        "is/frac_truncated": _mean(metrics, "is/frac_truncated"),
        "kl/sample_train_v1": _mean(metrics, "kl/sample_train_v1"),
        "reward": [round(float(m["env/reward/mean"]), 4) for m in metrics if "env/reward/mean" in m],
        "test_correct": metrics[-1].get("test/correct"),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--out", type=Path, default=Path("/tmp/importance-runs"))
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()
    for seed in args.seeds:
        for mode in ("off", "tis"):
            print(json.dumps(run(args.out, seed, mode, args.steps, args.lr)), flush=True)


if __name__ == "__main__":
    main()
