"""The Measurements tables of docs/recipes/algorithm-distillation.md from runs of
``tempering recipe algorithm-distillation`` (one run directory per seed): per curve, the first
and last episode's return and the summed shortfall (regret), mean ± sd over the runs and per
run, then (``--last k``) the mean return of the last ``k`` episodes and its fraction of the
source's, then the mean return per episode every ``--every`` episodes.

Example::

    python tests/benchmarks/ad_tables.py runs/ad-bandit-0 runs/ad-bandit-1 runs/ad-bandit-2 --every 10
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _ms(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument(
        "--last", type=int, default=0, help="also: the mean return of the last this many episodes"
    )
    args = parser.parse_args()
    summaries = [json.loads((r / "summary.json").read_text()) for r in args.runs]
    curves = [json.loads((r / "in-context" / "curves.json").read_text()) for r in args.runs]
    names = list(curves[0])
    print(
        "| curve | first episode return | last episode return | regret (summed shortfall) | regret per seed |"
    )
    print("| --- | --- | --- | --- | --- |")
    for n in names:
        first = [s[f"{n}_first_return"] for s in summaries]
        last = [s[f"{n}_last_return"] for s in summaries]
        regret = [s[f"{n}_regret"] for s in summaries]
        per_seed = ", ".join(f"{x:.1f}" for x in regret)
        print(f"| {n} | {_ms(first)} | {_ms(last)} | {_ms(regret)} | {per_seed} |")
    walls = ", ".join(f"{s.get('wall_seconds', float('nan')):.0f}" for s in summaries)
    print(f"\noptimal return per episode {_ms([s['optimal_return'] for s in summaries])}; wall s: {walls}\n")
    if args.last:
        k = args.last
        print(f"| curve | mean return of the last {k} episodes | per seed | of the source's |")
        print("| --- | --- | --- | --- |")
        source = [float(np.mean(c["source"][-k:])) for c in curves] if "source" in names else None
        for n in names:
            tail = [float(np.mean(c[n][-k:])) for c in curves]
            ratio = ", ".join(f"{t / q:.2f}" for t, q in zip(tail, source, strict=True)) if source else ""
            print(f"| {n} | {_ms(tail)} | {', '.join(f'{t:.2f}' for t in tail)} | {ratio} |")
        print()
    n_e = len(curves[0][names[0]])
    episodes = list(range(0, n_e, args.every))
    print("| curve | " + " | ".join(str(e) for e in episodes) + " |")
    print("| --- |" + " --- |" * len(episodes))
    for n in names:
        mean_E = np.mean([c[n] for c in curves], axis=0)
        print(f"| {n} | " + " | ".join(f"{mean_E[e]:.2f}" for e in episodes) + " |")


if __name__ == "__main__":
    main()
