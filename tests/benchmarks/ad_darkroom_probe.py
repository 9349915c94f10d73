"""A Dark Room diagnosis of the RL-format AD model (docs/recipes/algorithm-distillation.md,
"Dark Room: rows and columns"): train one variant on a set of histories (written on first use),
then report its next-action accuracy on 256 training windows and its return per in-context
episode on 16 *training* goals and on the 16 held-out goals, actions sampled and argmax, beside
the Q-learner's own curve on the held-out goals.

Example::

    python tests/benchmarks/ad_darkroom_probe.py --name xy --grid 9 --prev --steps 3000 --batch 32
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from tempering.ad import (
    ADModelConfig,
    ADTrainConfig,
    DarkRoomFamily,
    HistoryDataset,
    evaluate_in_context,
    read_histories,
    source_curve,
    train_ad,
    write_histories,
)
from tempering.training import RunDir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/ad-darkroom-probe"))
    p.add_argument("--hist", type=Path, default=None, help="histories (default: <out>/h<tasks>x<episodes>)")
    p.add_argument("--n-tasks", type=int, default=65)
    p.add_argument("--n-episodes", type=int, default=40)
    p.add_argument("--window", type=int, default=80)
    p.add_argument("--stride", type=int, default=20)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--grid", type=int, default=0, help="ADModelConfig.grid_width (9: rows + columns)")
    p.add_argument("--prev", action="store_true", help="ADModelConfig.previous_state")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--name", default="probe")
    a = p.parse_args()
    family = DarkRoomFamily()
    hist = a.hist or a.out / f"h{a.n_tasks}x{a.n_episodes}"
    t0 = time.monotonic()
    if not hist.exists():
        write_histories(family, hist, n_tasks=a.n_tasks, n_episodes=a.n_episodes, seed=a.seed)
    h = read_histories(hist)
    print(
        "source, training goals, return every 4 episodes:", np.round(h.returns_NE().mean(0)[::4], 2).tolist()
    )
    ds = HistoryDataset(h, window=a.window, stride=a.stride)
    model_config = ADModelConfig(
        n_states=family.n_states, n_actions=family.n_actions, context=a.window, d_model=a.d,
        n_layers=a.layers, previous_state=a.prev, grid_width=a.grid,
    )  # fmt: skip
    train = ADTrainConfig(
        log_dir=str(a.out / a.name), model=model_config, steps=a.steps, batch_size=a.batch,
        learning_rate=a.lr, seed=a.seed, device="cpu", if_exists="overwrite", log_every=50,
        save_every=a.steps,
    )  # fmt: skip
    model = train_ad(train, ds, n_states=family.n_states, n_actions=family.n_actions, progress=True)
    with torch.no_grad():
        index = np.random.default_rng(0).choice(len(ds), size=min(256, len(ds)), replace=False).tolist()
        items = [ds.tensors(i) for i in index]
        losses = model.losses({k: torch.stack([it[k] for it in items]) for k in items[0]})
    logged = RunDir(a.out / a.name).read_metrics()
    tail = logged[-max(1, len(logged) // 10) :]
    tail_accuracy = np.mean([m["train/action_accuracy"] for m in tail])
    print(
        f"{len(ds)} windows; next-action accuracy on 256 of them {float(losses['action_accuracy']):.3f}, "
        f"on the batches of the last tenth of training {tail_accuracy:.3f}; "
        f"trained in {time.monotonic() - t0:.0f} s"
    )
    train_goals = list(range(0, len(family.goals(False)), 4))[:16]
    out: dict[str, list[float]] = {}
    for split, seeds, held_out in (("train", train_goals, False), ("held-out", list(range(16)), True)):
        for greedy in (False, True):
            c = evaluate_in_context(
                model, family, seeds, a.episodes, seed=a.seed, greedy=greedy, held_out=held_out
            )
            m = c.mean(0)
            key = f"{split}/{'argmax' if greedy else 'sampled'}"
            out[key] = m.tolist()
            print(
                f"{key}: first 5 {m[:5].mean():.2f} last 5 {m[-5:].mean():.2f} "
                f"every 2: {np.round(m[::2], 1).tolist()}"
            )
    src = source_curve(family, list(range(16)), a.episodes).mean(0)
    out["held-out/source"] = src.tolist()
    print(f"source held-out: last 5 {src[-5:].mean():.2f} every 2: {np.round(src[::2], 1).tolist()}")
    (a.out / f"{a.name}.json").write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
