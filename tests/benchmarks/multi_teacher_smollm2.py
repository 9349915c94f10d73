"""Multi-teacher on-policy distillation on the real model (issue 29): one teacher per dataset.

SmolLM2-135M-Instruct, two datasets interleaved one group at a time
(:class:`~tempering.rl.interleaved.InterleavedRLDatasetBuilder`, weights 1:1), no task reward
(pure distillation: the only signal is each group's teacher's reverse KL on the student's tokens,
``RLConfig.distill_teachers``):

- ``demo``: the demo's bare two-digit problems ``a+b=`` / ``a-b=``
  (:class:`~tempering.envs.arithmetic.ArithmeticProblems`, ``--n-test`` held out), its teacher
  ``--demo-teacher`` (e.g. a ``tempering demo`` RL run directory: it answers with the bare number);
- ``chat``: the shipped chat questions (:class:`~tempering.envs.tasks.ChatProblems` on
  ``arithmetic_chat.jsonl``: "What is 46 + 91?", "Reverse the word ...", ...), its teacher
  ``--chat-teacher`` (e.g. a ``tempering recipe chat-sft`` run's ``<out>/sft``).

The student is the base model with a fresh LoRA adapter (rank 32, seed 1), so it starts as the
untrained instruct model. ``--single demo`` is the control: every group scored by the demo
teacher. After training, the student is evaluated as the recipes' real-model pages evaluate
(the base model's figures are in those pages): the demo split's held-out accuracy
(``AccuracyEvaluator``, ``--eval-samples`` answers per problem at T=1, evaluation seeds 0, 1, 2,
greedy once) and the exact match of the reply to the held-out chats (``--chats``, T=1 per seed,
and greedy). One JSON line per training step (per-teacher reverse KL) and one with the figures.

    nice -n 10 .venv/bin/python tests/benchmarks/multi_teacher_smollm2.py \\
        --demo-teacher runs/demo/rl --chat-teacher runs/chat/sft --steps 10 --out /tmp/mt
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from tempering.assets import ASSET_PREFIX, resolve_data_path
from tempering.backend import ModelConfig, load_renderer, load_tokenizer, service_client
from tempering.data import load_chat
from tempering.envs.arithmetic import ArithmeticProblems, split_problems
from tempering.envs.tasks import ChatProblems
from tempering.evals.accuracy import AccuracyEvaluator
from tempering.evals.reply import ReplyEvaluator, held_out_replies
from tempering.rl.interleaved import InterleavedRLDatasetBuilder
from tempering.rl.train import RLConfig, train
from tempering.training import AdamConfig, LRSchedule, RunConfig
from tempering.training.checkpoints import sampler_weights

MODEL = os.environ.get("BENCH_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct")


def _spread(values: list[float]) -> dict[str, object]:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {
        "values": [round(v, 4) for v in values],
        "mean": round(statistics.fmean(values), 4),
        "sd": round(sd, 4),
    }


async def main_async(args: argparse.Namespace) -> None:
    service = service_client()
    teachers = {
        "demo": await sampler_weights(service, args.demo_teacher, "--demo-teacher"),
        "chat": await sampler_weights(service, args.chat_teacher, "--chat-teacher"),
    }
    sources = {
        "demo": ArithmeticProblems(
            base_model=MODEL, seed=0, n_test=args.n_test, batch_size=4, group_size=args.group_size,
            test_group_size=0, reward_coef=0.0,
        ),
        "chat": ChatProblems(
            base_model=MODEL, train_path=ASSET_PREFIX + "arithmetic_chat.jsonl", batch_size=4,
            group_size=args.group_size, reward_coef=0.0,
        ),
    }  # fmt: skip
    routing = (
        {"distill_teachers": teachers} if args.single is None else {"distill_teacher": teachers[args.single]}
    )
    config = RLConfig(
        run=RunConfig(log_dir=str(args.out / "distill"), if_exists="overwrite", save_every=0, eval_every=0,
                      progress=False),
        dataset=InterleavedRLDatasetBuilder(
            sources=sources, weights={"demo": 1.0, "chat": 1.0}, groups_per_batch=args.groups,
            num_batches=args.steps,
        ),
        model=ModelConfig(base_model=MODEL, lora_rank=32 if MODEL != "tempering/tiny" else 0, seed=1),
        adam=AdamConfig(learning_rate=args.lr, schedule=LRSchedule("constant")),
        num_steps=args.steps,
        max_tokens=args.max_tokens,
        seed=0,
        **routing,  # pyright: ignore[reportArgumentType]
    )  # fmt: skip
    t0 = time.perf_counter()
    result = await train(config, service=service)
    train_seconds = time.perf_counter() - t0
    for line in result.metrics:
        print(
            json.dumps({k: v for k, v in line.items() if k == "step" or k.startswith("distill/")}), flush=True
        )
    path = result.final.sampler_path
    assert path is not None
    student = await service.create_sampling_client(model_path=path)

    renderer, tokenizer = load_renderer(MODEL), load_tokenizer(MODEL)
    _, test_problems = split_problems(seed=0, n_test=args.n_test)
    sampled: list[float] = []
    greedy = float("nan")
    for seed in (0, 1, 2):
        ev = AccuracyEvaluator(
            test_problems, renderer, tokenizer, num_samples=args.eval_samples, seed=seed, greedy=seed == 0
        )
        await ev(student)
        sampled.append(ev.records[-1].accuracy)
        greedy = ev.records[-1].greedy_accuracy if seed == 0 else greedy
    items = [(list(p), r) for p, r in held_out_replies(load_chat(resolve_data_path(args.chats)).items)]
    chat_greedy = ReplyEvaluator(items, renderer, max_tokens=16, n_show=4)
    chat_greedy_em = (await chat_greedy(student))["test/exact_match"]
    chat_sampled = [
        (await ReplyEvaluator(items, renderer, max_tokens=16, temperature=1.0, seed=seed)(student))[
            "test/exact_match"
        ]
        for seed in (0, 1, 2)
    ]
    routing_name = "one teacher per dataset" if args.single is None else f"{args.single} teacher for both"
    print(
        json.dumps({
            "routing": routing_name, "steps": args.steps, "train_seconds": round(train_seconds, 1),
            "demo_heldout_t1": _spread(sampled), "demo_heldout_greedy": greedy,
            "n_test": len(test_problems), "chat_heldout_t1": _spread(chat_sampled),
            "chat_heldout_greedy": chat_greedy_em, "chat_items": len(items),
            "chat_greedy_samples": [
                {"prompt": r.prompt, "reply": r.reply, "reference": r.reference}
                for r in chat_greedy.records[-1].replies
            ],
            "student_sampler_path": path,
        }),
        flush=True,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo-teacher", required=True, help="run directory, sampler path or state path")
    parser.add_argument("--chat-teacher", required=True, help="run directory, sampler path or state path")
    parser.add_argument(
        "--single", choices=["demo", "chat"], default=None, help="control: one teacher for both"
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--groups", type=int, default=4, help="groups per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--n-test", type=int, default=32)
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--chats", default=ASSET_PREFIX + "arithmetic_chat_test.jsonl")
    parser.add_argument("--out", type=Path, default=Path("/tmp/multi-teacher"))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
