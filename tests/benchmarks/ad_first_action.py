"""The action distribution of a recipe run's final RL-format models with an empty context (the
first step of every held-out task): ``P(a)`` from the action head after the first state alone.

Example::

    python tests/benchmarks/ad_first_action.py runs/ad-bandit-expert-0 runs/ad-bandit-expert-1 --model ed
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from tempering.ad import ADModelConfig, load_model
from tempering.training import RunDir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--model", default="ed", help="ad or ed")
    args = parser.parse_args()
    for run in args.runs:
        model_dir = RunDir(run / f"{args.model}-model")
        config = model_dir.read_config()["model"]
        final = model_dir.last_checkpoint()
        if final is None or not final.final:
            raise SystemExit(f"{model_dir.path}: no final checkpoint; finish the run first")
        model_config = ADModelConfig(**{k: v for k, v in config.items() if not k.startswith("__")})
        model = load_model(final.state_path, model_config, "cpu")
        model.eval()
        zero = torch.zeros(1, 1, dtype=torch.long)
        with torch.no_grad():
            out = model(zero, zero, torch.zeros(1, 1), torch.zeros(1, 1))
        probs = torch.softmax(out.action_logits_BTA[0, -1], -1).tolist()
        print(f"{run} {args.model}: P(a | empty context) = {', '.join(f'{p:.2f}' for p in probs)}")


if __name__ == "__main__":
    main()
