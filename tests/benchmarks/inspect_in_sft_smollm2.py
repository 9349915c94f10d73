"""An inspect task as the periodic evaluation of a real SFT run (issue 30): its accuracy, with a
95% Wilson interval, before, during and after training, over seeds; and what one evaluation costs.

SmolLM2-135M-Instruct (``smollm2-135m-instruct``, converted locally), LoRA rank 8, SFT on the
shipped arithmetic chats (``tempering-assets:arithmetic_chat.jsonl``, 400 conversations, batch
8, Adam lr 5e-4 constant). The inspect task, defined below with ``@task`` (so the suite finds it
by name once this module is imported), asks the first question of each of the first ``--limit``
shipped held-out conversations (``arithmetic_chat_test.jsonl``: sums, differences, counting,
word reversal; with the conversation's system message, "Answer with the result only.", where it
has one) and scores the reply with ``match()`` (the target at the end of the reply). It runs in
the suite as ``inspect:held_out_arithmetic`` with ``nll`` (the same held-out chats' NLL), every
``--eval-every`` steps, at T=0.6 and 24 tokens. The run's seed is the model's (LoRA init), the
batch order's and the evaluation's. Per seed it prints one JSON line: per evaluation (step 0 is
before training) the accuracy, its interval, the NLL and the evaluation's wall time; then the
mean and sd over seeds of the first and last accuracy.

    nice -n 10 .venv/bin/python tests/benchmarks/inspect_in_sft_smollm2.py --steps 20 --seeds 0 1 2

The task alone, on the untrained model (``tempering eval``, one seed per command)::

    tempering eval --base-model smollm2-135m-instruct --limit 40 --max-tokens 32 --seed 0 \\
      --benchmark inspect:tests/benchmarks/inspect_in_sft_smollm2.py@held_out_arithmetic
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessage, ChatMessageSystem, ChatMessageUser
from inspect_ai.scorer import match
from inspect_ai.solver import generate

from tempering.assets import ASSET_PREFIX, resolve_data_path
from tempering.backend import ModelConfig
from tempering.data import load_chat
from tempering.evals.suite import EvalSuite
from tempering.sft import ChatData, SFTConfig
from tempering.training import AdamConfig, LRSchedule, RunConfig

TASK = "held_out_arithmetic"


@task(name=TASK)
def held_out_arithmetic() -> Task:
    """The first question of every shipped held-out arithmetic conversation (with the system
    message before it, if any), its target the reply that follows."""
    conversations = load_chat(resolve_data_path(ASSET_PREFIX + "arithmetic_chat_test.jsonl")).items
    samples: list[Sample] = []
    for i, conversation in enumerate(conversations):
        first = next(j for j, m in enumerate(conversation) if m["role"] == "user")
        messages: list[ChatMessage] = [
            ChatMessageSystem(content=str(m["content"]))
            if m["role"] == "system"
            else ChatMessageUser(content=str(m["content"]))
            for m in conversation[: first + 1]
        ]
        samples.append(Sample(input=messages, target=str(conversation[first + 1]["content"]), id=i))
    return Task(dataset=MemoryDataset(samples), solver=generate(), scorer=match())


def run(
    out: Path, seed: int, steps: int, eval_every: int, limit: int
) -> tuple[dict[str, object], list[dict[str, float]]]:
    config = SFTConfig(
        run=RunConfig(log_dir=str(out / f"seed{seed}"), save_every=0, eval_every=eval_every, progress=False),
        model=ModelConfig(base_model="smollm2-135m-instruct", lora_rank=8, seed=seed),
        data=ChatData(batch_size=8, seed=seed),
        adam=AdamConfig(learning_rate=5e-4, schedule=LRSchedule("constant")),
        max_steps=steps,
        evals=EvalSuite(
            benchmarks=(f"inspect:{TASK}", "nll"), limit=limit, temperature=0.6, max_tokens=24, seed=seed
        ),
    )
    t0 = time.perf_counter()
    metrics = asyncio.run(config()).metrics
    key = f"inspect/{TASK}/match/accuracy"
    evaluations: list[dict[str, float]] = []
    for step, line in enumerate(metrics):
        for prefix, at in (("initial/", 0), ("", step + 1)):
            if prefix + key in line:
                evaluations.append(
                    {
                        "step": at,
                        "accuracy": line[prefix + key],
                        "ci_low": line[prefix + key + "_ci_low"],
                        "ci_high": line[prefix + key + "_ci_high"],
                        "samples": line[f"{prefix}inspect/{TASK}/samples"],
                        "nll": line[prefix + "nll/nll"],
                    }
                )
    result: dict[str, object] = {
        "seed": seed,
        "evaluations": evaluations,
        "eval_s": [round(float(m["time/eval"]), 1) for m in metrics if "time/eval" in m],
        "wall_s": round(time.perf_counter() - t0, 1),
        "log_dir": str(out / f"seed{seed}"),
    }
    return result, evaluations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="inspect-sft-"))
    first: list[float] = []
    last: list[float] = []
    for seed in args.seeds:
        result, evaluations = run(out, seed, args.steps, args.eval_every, args.limit)
        print(json.dumps(result), flush=True)
        first.append(evaluations[0]["accuracy"])
        last.append(evaluations[-1]["accuracy"])
    sd = statistics.stdev if len(first) > 1 else (lambda _: 0.0)
    summary = {
        "seeds": args.seeds,
        "accuracy_before": {"mean": statistics.fmean(first), "sd": sd(first)},
        "accuracy_after": {"mean": statistics.fmean(last), "sd": sd(last)},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
