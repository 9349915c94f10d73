"""Held-out figures of finished recipe runs on the real model, with their spread: the numbers of
the "On the real model" sections of docs/recipes/{chat-sft,dpo,distill,trajectory-sft}.md.

Each ``NAME=PATH`` is a sampler-weights path of a run (``summary.json``'s ``…_sampler_path``)
or ``base`` (the untrained ``--base-model``). Per name, one JSON line:

- ``replies`` (chat-sft: ``--chats``, a chat JSONL; dpo: ``--pairs`` with ``--test-pairs`` and
  ``--seed``, the recipe's held-out pairs): exact match of the reply to each held-out prompt,
  greedy once and sampled at T=1 once per ``--eval-seeds`` seed (independent draws per item),
  with the mean and sd over the seeds; plus the greedy exact match on ``--splits`` disjoint
  splits of the items (its sd is the spread over data splits: greedy is deterministic).
- ``pairs`` (dpo): preference accuracy and log-prob margin per split, and, for every name after
  the first (the reference), the implicit reward accuracy and margin against the first.
- ``arithmetic`` (distill, trajectory-sft): the demo split's held-out accuracy
  (:class:`~tempering.evals.accuracy.AccuracyEvaluator`, ``--eval-samples`` answers per problem at
  T=1) per evaluation seed, mean and sd, and greedy.

    nice -n 10 .venv/bin/python tests/benchmarks/recipe_eval_smollm2.py replies \\
        --chats tempering-assets:arithmetic_chat_test.jsonl base after=tempering://...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from collections.abc import Sequence

import numpy as np

from tempering.assets import resolve_data_path
from tempering.backend import ServiceClient, load_renderer, load_tokenizer, service_client
from tempering.data import load_chat
from tempering.envs.arithmetic import split_problems
from tempering.evals.accuracy import AccuracyEvaluator
from tempering.evals.reply import ReplyEvaluator, held_out_replies
from tempering.preference import ComparisonData
from tempering.preference.evaluation import chosen_answers, dpo_pair_figures, pair_logprobs
from tempering_protocols import LabeledComparison, Message, SamplingClient

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _spread(values: Sequence[float]) -> dict[str, object]:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {
        "values": [round(v, 4) for v in values],
        "mean": round(statistics.fmean(values), 4),
        "sd": round(sd, 4),
    }


def _splits(n: int, k: int) -> list[range]:
    size = -(-n // k)
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def _rejected(pair: LabeledComparison) -> str:
    c = pair.comparison
    return (c.completion_B if pair.label == "A" else c.completion_A)[-1]["content"]


async def _client(service: ServiceClient, path: str, base_model: str) -> SamplingClient:
    if path == "base":
        return await service.create_sampling_client(base_model=base_model)
    return await service.create_sampling_client(model_path=path)


async def _replies(
    client: SamplingClient, items: list[tuple[list[Message], str]], args: argparse.Namespace
) -> dict[str, object]:
    renderer = load_renderer(args.base_model, None)
    out: dict[str, object] = {"items": len(items)}
    if args.greedy:
        greedy = ReplyEvaluator(items, renderer, max_tokens=args.max_tokens, n_show=len(items))
        await greedy(client)
        correct = [r.correct for r in greedy.records[-1].replies]
        out["greedy"] = round(float(np.mean(correct)), 4)
        by_split = [float(np.mean([correct[i] for i in r])) for r in _splits(len(items), args.splits)]
        out["greedy_by_split"] = _spread(by_split)
    sampled: list[float] = []
    for seed in args.eval_seeds:
        ev = ReplyEvaluator(items, renderer, max_tokens=args.max_tokens, temperature=1.0, seed=seed, n_show=3)
        sampled.append((await ev(client))["test/exact_match"])
    out["sampled_t1"] = _spread(sampled)
    out["t1_samples"] = [
        {"prompt": r.prompt, "reply": r.reply, "reference": r.reference} for r in ev.records[-1].replies
    ]
    return out


async def main_async(args: argparse.Namespace) -> None:
    service = service_client()
    named = [tuple(spec.split("=", 1)) if "=" in spec else (spec, spec) for spec in args.models]
    renderer = load_renderer(args.base_model, None)
    reference_pairs = None
    for name, path in named:
        client = await _client(service, path, args.base_model)
        line: dict[str, object] = {"name": name, "path": path, "kind": args.kind}
        if args.kind == "replies":
            if args.pairs:
                _, test = ComparisonData(
                    path=args.pairs, test_size=args.test_pairs, batch_size=1, seed=args.seed
                )()
                assert test is not None
                items = chosen_answers(test.items)
            else:
                items = held_out_replies(load_chat(resolve_data_path(args.chats)).items)
            line |= await _replies(client, [(list(p), r) for p, r in items], args)
        elif args.kind == "pairs":
            _, test = ComparisonData(
                path=args.pairs, test_size=args.test_pairs, batch_size=1, seed=args.seed
            )()
            assert test is not None
            pairs = list(test.items)
            logprobs = await pair_logprobs(client, renderer, pairs)
            reference_pairs = reference_pairs or logprobs
            split_figures = [
                dpo_pair_figures(
                    (reference_pairs[0][list(r)], reference_pairs[1][list(r)]),
                    (logprobs[0][list(r)], logprobs[1][list(r)]),
                    beta=args.beta,
                )[0]
                for r in _splits(len(logprobs[0]), args.splits)
            ]
            whole, _ = dpo_pair_figures(reference_pairs, logprobs, beta=args.beta)
            line |= {
                "pairs": len(logprobs[0]),
                **{
                    k: round(v, 4) for k, v in whole.items() if k.endswith("_after") or k.startswith("reward")
                },
            }
            # The shipped pairs are of two kinds: the rejected reply rambles (longer than 20
            # characters) or is a wrong short answer; the implicit reward per kind.
            kept = [p for p in pairs if p.label != "Tie"]
            rambling = [len(_rejected(p)) > 20 for p in kept]
            for kind, want in (("rambling", True), ("incorrect", False)):
                idx = [i for i, r in enumerate(rambling) if r == want]
                if idx:
                    fig, _ = dpo_pair_figures(
                        (reference_pairs[0][idx], reference_pairs[1][idx]),
                        (logprobs[0][idx], logprobs[1][idx]),
                        beta=args.beta,
                    )
                    line[f"{kind}_pairs"] = len(idx)
                    for key in ("preference_accuracy_after", "reward_accuracy", "reward_margin"):
                        line[f"{kind}_{key}"] = round(fig[key], 4)
            for key in (
                "preference_accuracy_after",
                "logprob_margin_after",
                "reward_accuracy",
                "reward_margin",
            ):
                line[f"{key}_by_split"] = _spread([f[key] for f in split_figures])
        else:
            _, test_problems = split_problems(seed=args.seed, n_test=args.n_test)
            tokenizer = load_tokenizer(args.base_model)
            sampled: list[float] = []
            greedy = float("nan")
            for k, seed in enumerate(args.eval_seeds):
                ev = AccuracyEvaluator(
                    test_problems,
                    renderer,
                    tokenizer,
                    num_samples=args.eval_samples,
                    seed=seed,
                    greedy=args.greedy and k == 0,
                )
                await ev(client)
                sampled.append(ev.records[-1].accuracy)
                if args.greedy and k == 0:
                    greedy = ev.records[-1].greedy_accuracy
            line |= {"n_test": len(test_problems), "sampled_t1": _spread(sampled), "greedy": round(greedy, 4)}
            line["t1_samples"] = [
                {
                    "question": problem.question,
                    "answers": [a.text for a in answers],
                    "reference": problem.answer,
                }
                for problem, answers in ev.records[-1].problems[:3]
            ]
        print(json.dumps(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=["replies", "pairs", "arithmetic"])
    parser.add_argument("models", nargs="+", help="NAME=SAMPLER_PATH or base")
    parser.add_argument("--base-model", default=MODEL)
    parser.add_argument("--chats", default="tempering-assets:arithmetic_chat_test.jsonl")
    parser.add_argument(
        "--pairs",
        default=None,
        help="labeled comparisons (dpo), e.g. tempering-assets:arithmetic_preferences.jsonl",
    )
    parser.add_argument("--test-pairs", type=int, default=60)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0, help="the recipe's --seed (its held-out split)")
    parser.add_argument("--n-test", type=int, default=200)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--eval-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--greedy", action=argparse.BooleanOptionalAction, default=True, help="also the greedy pass"
    )
    parser.add_argument("--splits", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
