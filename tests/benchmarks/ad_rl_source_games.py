"""The RL source of ``tempering recipe algorithm-distillation --task guess-number --source rl``
runs, played on the token env itself: each run's SFT warm start and final RL weights play
``--games`` games on every held-out (odd) and every training (even) number, sampled at
temperature 1 with the recipe's rules (1..16, 6 turns), and the success rates are printed, mean
± sd over the runs. It says what the RL policy does on numbers it was never rewarded for, the
comparison the AD model's held-out curve needs.

Example::

    python tests/benchmarks/ad_rl_source_games.py runs/ad-guess-rl-0 runs/ad-guess-rl-1 --games 16
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import numpy as np

from tempering.ad.guess_env import GuessNumberEnvFamily
from tempering.ad.rl_source import rules_of
from tempering.backend import close_service, load_renderer, service_client
from tempering.envs.guess_number import GuessNumberGroupBuilder
from tempering.recipes.algorithm_distillation_rl import MAX_REPLY_TOKENS
from tempering.rl.evaluate import evaluate_guess_number_seeds
from tempering.training import RunDir


async def play(runs: list[Path], games: int) -> dict[str, list[float]]:
    family = GuessNumberEnvFamily()
    renderer = load_renderer("tempering/tiny")
    service = service_client()
    out: dict[str, list[float]] = {}
    try:
        for run in runs:
            for stage in ("source-sft", "source-rl"):
                final = RunDir(run / stage).last_checkpoint()
                if final is None or final.sampler_path is None:
                    raise SystemExit(f"{run / stage}: no final checkpoint")
                sampler = await service.create_sampling_client(model_path=final.sampler_path)
                for split, held_out in (("held-out", True), ("training", False)):
                    builders = [
                        GuessNumberGroupBuilder(renderer, n, rules_of(family), group_size=games)
                        for n in family.numbers(held_out)
                    ]
                    stats, _ = await evaluate_guess_number_seeds(
                        sampler, builders, max_tokens=MAX_REPLY_TOKENS, seeds=[7919]
                    )
                    out.setdefault(f"{stage} {split} success", []).append(stats.success)
                    out.setdefault(f"{stage} {split} invalid", []).append(stats.invalid)
    finally:
        close_service(service)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--games", type=int, default=16)
    args = parser.parse_args()
    rows = asyncio.run(play(args.runs, args.games))
    print("| weights, numbers | mean ± sd | per run |")
    print("| --- | --- | --- |")
    for name, v in rows.items():
        print(f"| {name} | {np.mean(v):.3f} ± {np.std(v):.3f} | " + ", ".join(f"{x:.3f}" for x in v) + " |")


if __name__ == "__main__":
    main()
