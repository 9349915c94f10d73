"""Probe a language-format model of ``tempering recipe algorithm-distillation --format language``:
its probability of each reply after hand-made contexts. A model that learned in context answers
them differently; one that did not gives the same distribution after each.

- ``--task bandit``: the reply ``arm k`` after one arm pulled ``--pulls`` times and always paid,
  or never; arms cycled with one paid or all but one; no context.
- ``--task darkroom``: the first move of a second episode, after a first episode that walked 2
  cells up, down, left or right from the start and then stayed there, paid 1 on every step at
  that cell (the goal found) or never paid (the same walk, no goal); and with no context.

Example::

    python tests/benchmarks/ad_language_probe.py runs/ad-bandit-lm-0 [--base-model tempering/tiny]
    python tests/benchmarks/ad_language_probe.py runs/ad-darkroom-lm-0 --task darkroom
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import tinker

from tempering.ad import BanditFamily, DarkRoomFamily
from tempering.ad.dataset import transcript
from tempering.backend import load_tokenizer, service_client
from tempering.recipes._common import load_renderer
from tempering_protocols import InContextTaskFamily

Context = tuple[list[int], list[int], list[float]]  # states (one more than actions), actions, rewards


def bandit_contexts(n: int) -> dict[str, Context]:
    cycled = [i % 5 for i in range(n)]
    zeros = [0] * (n + 1)
    return {
        f"arm 2 pulled {n} times, always paid": (zeros, [2] * n, [1.0] * n),
        f"arm 2 pulled {n} times, never paid": (zeros, [2] * n, [0.0] * n),
        "arms 0-4 in turn, only arm 3 paid": (zeros, cycled, [float(a == 3) for a in cycled]),
        "arms 0-4 in turn, all but arm 3 paid": (zeros, cycled, [float(a != 3) for a in cycled]),
        "no context": ([0], [], []),
    }


def darkroom_contexts(family: DarkRoomFamily) -> dict[str, Context]:
    contexts: dict[str, Context] = {}
    for move in (1, 2, 3, 4):  # up, down, left, right
        actions = [move, move] + [0] * (family.horizon - 2)
        for paid in (True, False):
            task = family.task(0, False)
            task.goal = -1  # no goal: the rewards are set below
            states = [task.reset()]
            for a in actions:
                states.append(task.step(a)[0])
            states[-1] = task.reset()  # the second episode starts
            rewards = [float(paid and i >= 1) for i in range(len(actions))]
            outcome = "paid 1 there" if paid else "never paid"
            name = f"2 cells {family.describe_action(move)}, then stay: {outcome}"
            contexts[name] = (states, actions, rewards)
    contexts["no context"] = ([family.task(0, False).reset()], [], [])
    return contexts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the recipe's run directory")
    parser.add_argument("--task", choices=["bandit", "darkroom"], default="bandit")
    parser.add_argument("--model", default="lm-model", help="lm-model or lm-ed-model")
    parser.add_argument("--base-model", default="tempering/tiny")
    parser.add_argument(
        "--pulls", type=int, default=29, help="bandit: pulls in each context (the window - 1)"
    )
    args = parser.parse_args()
    rows = (args.run / args.model / "checkpoints.jsonl").read_text().splitlines()
    path = json.loads(rows[-1])["sampler_path"]
    family: InContextTaskFamily = BanditFamily() if args.task == "bandit" else DarkRoomFamily()
    renderer = load_renderer(args.base_model, None)
    tokenizer = load_tokenizer(args.base_model)
    sampler = service_client().create_sampling_client(model_path=path).result()

    def reply_probs(context: Context) -> tuple[np.ndarray, float]:
        states, actions, rewards = context
        messages = transcript(
            family, np.asarray(states, dtype=np.int64), np.asarray([*actions, 0], dtype=np.int64),
            np.asarray([*rewards, 0.0], dtype=np.float32), 0,
        )[:-1]  # fmt: skip
        prompt = renderer.build_generation_prompt(messages).to_ints()
        logps: list[float] = []
        for k in range(family.n_actions):
            reply = tokenizer.encode(family.describe_action(k), add_special_tokens=False)
            lp = sampler.compute_logprobs(tinker.ModelInput.from_ints(prompt + reply)).result()
            logps.append(sum(x for x in lp[-len(reply) :] if x is not None))
        p = np.exp(np.asarray(logps))
        return p / p.sum(), float(p.sum())

    if isinstance(family, DarkRoomFamily):
        contexts = darkroom_contexts(family)
        words = ", ".join(f"P({family.describe_action(a)})" for a in range(family.n_actions))
    else:
        contexts = bandit_contexts(args.pulls)
        words = "P(arm 0), …, P(arm 4)"
    print(f"| context | {words} | probability of any action's words |")
    print("| --- | --- | --- |")
    for name, context in contexts.items():
        p, mass = reply_probs(context)
        print(f"| {name} | {', '.join(f'{x:.2f}' for x in p)} | {mass:.2f} |")


if __name__ == "__main__":
    main()
