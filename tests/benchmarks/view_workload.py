"""The viewer's synthetic big run, shared by its endpoint and browser benchmarks: 10,000 steps of
40 metrics, and 1,000 trajectory-log parts (every 10th step) of 1,000 one-turn transitions each
(1M transitions)."""

# pyarrow ships no type information.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tempering.rl.trajectories import TRAJECTORY_SCHEMA

R = 1000  # transitions per part


def table(step: int, rng: np.random.Generator) -> Any:
    """One part: ``R`` one-turn episodes of step ``step``."""
    n = R
    ep = np.arange(n)
    cols = {
        "step": pa.array(np.full(n, step, np.int32)),
        "sampler_version": pa.array(np.full(n, step, np.int32)),
        "group": pa.array((ep // 8).astype(np.int32)),
        "batch_group": pa.array((ep // 8).astype(np.int32)),
        "member": pa.array((ep % 8).astype(np.int32)),
        "episode_id": pa.array([f"s{step}-p{e // 8}-g{e % 8}" for e in ep]),
        "prompt_id": pa.array([f"p{e // 8}" for e in ep]),
        "turn": pa.array(np.zeros(n, np.int32)),
        "ob_tokens": pa.array([list(range(20))] * n, pa.list_(pa.int32())),
        "ob_opaque": pa.array(np.zeros(n, np.int32)),
        "ob_extends": pa.array(np.zeros(n, bool)),
        "ac_tokens": pa.array([list(range(16))] * n, pa.list_(pa.int32())),
        "ac_logprobs": pa.array([[-0.5] * 16] * n, pa.list_(pa.float32())),
        "stop_reason": pa.array(["stop"] * n),
        "reward": pa.array(rng.random(n)),
        "episode_done": pa.array(np.ones(n, bool)),
        "masked": pa.array(np.zeros(n, bool)),
        "metrics": pa.array(["{}"] * n),
        "total_reward": pa.array(rng.random(n)),
        "final_reward": pa.array(np.zeros(n)),
        "advantage": pa.array(rng.normal(size=n)),
        "trained": pa.array(np.ones(n, bool)),
        "end_reason": pa.array(["done"] * n),
        "episode_metrics": pa.array(["{}"] * n),
        "tags": pa.array([["t"]] * n, pa.list_(pa.string())),
        "seed": pa.array(np.zeros(n, np.int64)),
    }
    return pa.table(cols).cast(TRAJECTORY_SCHEMA)


def big_run(root: Path) -> Path:
    """Write the synthetic run into ``root``; returns ``root``."""
    (root / "trajectories" / "rl").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    rng = np.random.default_rng(0)
    names = [f"{p}/m{i}" for p in ("env", "optim", "test", "time") for i in range(10)]
    with (root / "metrics.jsonl").open("w") as f:
        for s in range(10_000):
            f.write(
                json.dumps(
                    {"step": s, **{n: float(v) for n, v in zip(names, rng.normal(size=40), strict=True)}}
                )
                + "\n"
            )
    t = table(0, rng)
    for step in range(0, 10_000, 10):
        pq.write_table(t, root / "trajectories" / "rl" / f"step-{step:06d}.parquet")
    return root
