"""Probe a language-format bandit model of ``tempering recipe algorithm-distillation --task
bandit --format language``: its probability of each reply ``arm k`` after hand-made contexts
(one arm pulled ``--pulls`` times and always paid, or never; arms cycled with one paid or all but one;
no context). A model that learned in context answers them differently; one that did not gives
the same distribution after each.

Example::

    python tests/benchmarks/ad_language_probe.py runs/ad-bandit-lm-0 [--base-model tempering/tiny]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import tinker

from tempering.ad import BanditFamily
from tempering.ad.dataset import transcript
from tempering.backend import load_tokenizer, service_client
from tempering.recipes._common import load_renderer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the recipe's run directory")
    parser.add_argument("--model", default="lm-model", help="lm-model or lm-ed-model")
    parser.add_argument("--base-model", default="tempering/tiny")
    parser.add_argument("--pulls", type=int, default=29, help="pulls in each context (the window - 1)")
    args = parser.parse_args()
    rows = (args.run / args.model / "checkpoints.jsonl").read_text().splitlines()
    path = json.loads(rows[-1])["sampler_path"]
    family = BanditFamily()
    renderer = load_renderer(args.base_model, None)
    tokenizer = load_tokenizer(args.base_model)
    sampler = service_client().create_sampling_client(model_path=path).result()

    def reply_probs(actions: list[int], rewards: list[float]) -> tuple[np.ndarray, float]:
        n = len(actions)
        messages = transcript(
            family, np.zeros(n + 1, dtype=np.int64), np.asarray([*actions, 0], dtype=np.int64),
            np.asarray([*rewards, 0.0], dtype=np.float32), 0,
        )[:-1]  # fmt: skip
        prompt = renderer.build_generation_prompt(messages).to_ints()
        logps: list[float] = []
        for k in range(family.n_arms):
            reply = tokenizer.encode(family.describe_action(k), add_special_tokens=False)
            lp = sampler.compute_logprobs(tinker.ModelInput.from_ints(prompt + reply)).result()
            logps.append(sum(x for x in lp[-len(reply) :] if x is not None))
        p = np.exp(np.asarray(logps))
        return p / p.sum(), float(p.sum())

    n = args.pulls
    cycled = [i % 5 for i in range(n)]
    contexts = {
        f"arm 2 pulled {n} times, always paid": ([2] * n, [1.0] * n),
        f"arm 2 pulled {n} times, never paid": ([2] * n, [0.0] * n),
        "arms 0-4 in turn, only arm 3 paid": (cycled, [float(a == 3) for a in cycled]),
        "arms 0-4 in turn, all but arm 3 paid": (cycled, [float(a != 3) for a in cycled]),
        "no context": ([], []),
    }  # fmt: skip
    print("| context | P(arm 0), …, P(arm 4) | probability of any `arm k` reply |")
    print("| --- | --- | --- |")
    for name, (actions, rewards) in contexts.items():
        p, mass = reply_probs(actions, rewards)
        print(f"| {name} | {', '.join(f'{x:.2f}' for x in p)} | {mass:.2f} |")


if __name__ == "__main__":
    main()
