"""Re-evaluate the models of ``tempering recipe algorithm-distillation`` runs on more held-out
tasks than the recipe played (less noise per episode): each run's final AD / ED checkpoint
plays ``--eval-tasks`` held-out tasks (seeds ``1000 × run seed + i``, the recipe's, continued)
for ``--eval-episodes`` episodes, actions sampled, beside the source learner on the same tasks.
Prints per curve the first and last episode's return, the mean of the last ``--last``
episodes and the regret, mean ± sd over the runs. ``--training-tasks``: the models play tasks of
the training split instead (seeds ``i``; the diagnosis of a model that does not learn in context
on held-out tasks: does it on the tasks it was trained on?), and the source learner is left out.
Runs with ``--source rl`` are played in their family (guess-number under the env's rules); the
source curve there is the scripted learner's (the RL run's own is in its summary).

Example::

    python tests/benchmarks/ad_reevaluate.py runs/ad-darkroom-xy-0 runs/ad-darkroom-xy-1 --eval-tasks 48
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tempering.ad import ADModelConfig, evaluate_in_context, load_model, source_curve
from tempering.recipes.algorithm_distillation import family_of
from tempering.training import RunDir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--eval-tasks", type=int, default=48)
    parser.add_argument("--eval-episodes", type=int, default=20)
    parser.add_argument("--last", type=int, default=5)
    parser.add_argument("--training-tasks", action="store_true")
    args = parser.parse_args()
    rows: dict[str, dict[str, list[float]]] = {}
    for run in args.runs:
        summary = json.loads((run / "summary.json").read_text())
        seed = int(summary["config"]["seed"])
        family = family_of(summary["config"]["task"], summary["config"].get("source", "scripted"))
        held_out = not args.training_tasks
        seeds = [seed * 1000 + i if held_out else i for i in range(args.eval_tasks)]
        curves = {"source": source_curve(family, seeds, args.eval_episodes)} if held_out else {}
        for name in ("ad", "ed"):
            model_dir = RunDir(run / f"{name}-model")
            if not model_dir.path.exists():
                continue
            config = model_dir.read_config()["model"]
            model_config = ADModelConfig(**{k: v for k, v in config.items() if not k.startswith("__")})
            final = model_dir.last_checkpoint()
            if final is None or not final.final:
                raise SystemExit(f"{model_dir.path}: no final checkpoint; finish the run first")
            model = load_model(final.state_path, model_config, "cpu")
            curves[name] = evaluate_in_context(
                model, family, seeds, args.eval_episodes, seed=seed, held_out=held_out
            )
        for name, c in curves.items():
            row = rows.setdefault(name, {"first": [], "last": [], "tail": [], "regret": []})
            row["first"].append(float(c[:, 0].mean()))
            row["last"].append(float(c[:, -1].mean()))
            row["tail"].append(float(c[:, -args.last :].mean()))
            best_N = np.array([family.task(x, held_out).optimal_return() for x in seeds])
            row["regret"].append(float((best_N[:, None] - c).sum(axis=1).mean()))
    k = args.last
    print(f"| curve | first episode | last episode | mean of the last {k} | regret | last {k} per run |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, row in rows.items():
        cells = [f"{np.mean(v):.2f} ± {np.std(v):.2f}" for v in row.values()]
        print(f"| {name} | " + " | ".join(cells) + " | " + ", ".join(f"{x:.2f}" for x in row["tail"]) + " |")


if __name__ == "__main__":
    main()
