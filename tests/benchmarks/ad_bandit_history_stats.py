"""What a bandit learning history holds, early and late: the share of pulls on each task's best
arm, the pseudo-regret and the number of distinct arms pulled, in the first and in the last
``--final`` pulls of every task (expert distillation's ``--ed-data final`` windows are the
latter).

Example::

    python tests/benchmarks/ad_bandit_history_stats.py runs/ad-bandit-0/histories --seed 0 --final 100
"""

from __future__ import annotations

import argparse

import numpy as np

from tempering.ad import BanditFamily, read_histories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("histories")
    parser.add_argument(
        "--seed", type=int, default=0, help="the recipe's --seed (task seeds seed * 100003 + i)"
    )
    parser.add_argument("--final", type=int, default=100)
    args = parser.parse_args()
    h = read_histories(args.histories)
    family = BanditFamily()
    stats: dict[str, list[float]] = {}
    for n in range(h.n_tasks):
        lo, hi = int(h.starts_N1[n]), int(h.starts_N1[n + 1])
        probs_K = family.task(args.seed * 100003 + n, False).probs_K
        actions = h.action_R[lo:hi]
        for part, a in (("first", actions[: args.final]), ("last", actions[-args.final :])):
            stats.setdefault(f"{part} best-arm share", []).append(float((a == probs_K.argmax()).mean()))
            stats.setdefault(f"{part} pseudo-regret", []).append(float((probs_K.max() - probs_K[a]).sum()))
            stats.setdefault(f"{part} distinct arms", []).append(float(len(set(a.tolist()))))
    print(f"{h.n_tasks} tasks, {args.final} pulls each part")
    for name, values in stats.items():
        print(f"{name}: {np.mean(values):.3f} ± {np.std(values):.3f}")


if __name__ == "__main__":
    main()
