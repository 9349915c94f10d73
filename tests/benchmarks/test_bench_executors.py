"""Env executors side by side on a CPU-bound env (issue: scale-out): about 50 ms of pure-Python
work per step, 4 turns, 64 groups x 8 members, through the inline executor, the process pool
(1 and 2 workers) and Ray (1 and 2 workers). The overhead of one env call against a direct
call is ``test_bench_env_call.py``. Run on demand: ``make bench`` or

    .venv/bin/python -m pytest tests/benchmarks/test_bench_executors.py -p no:randomly -q -s \
        --benchmark-enable --benchmark-only [-k ray]

(prints throughput in env steps per second; figures go to docs/benchmarks.md and docs/scaling.md).
Environment: ``BENCH_GROUPS`` / ``BENCH_CPU_S`` shrink the workload for a quick look.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rl"))

from ray_envs import WorkGroup
from test_rollouts import ScriptedPolicy

from tempering.rl.executors import InlineExecutor, ProcessPoolExecutor, RolloutExecutor
from tempering.rl.rollouts import RolloutConfig, rollout_batch

MEMBERS = 8
TURNS = 4
RL_DIR = str(Path(__file__).resolve().parents[1] / "rl")


@pytest.fixture(autouse=True)
def _workload(request: pytest.FixtureRequest) -> None:
    """The full workload under ``make bench``; a tiny smoke run under plain pytest (where the
    benchmark fixture calls each function once)."""
    config = request.config
    timing = bool(config.getoption("benchmark_enable")) or not config.getoption("benchmark_disable")
    global GROUPS, CPU_S
    GROUPS = int(os.environ.get("BENCH_GROUPS", "64")) if timing else 2
    CPU_S = float(os.environ.get("BENCH_CPU_S", "0.05")) if timing else 0.001
    if not timing and "ray" in request.node.name:
        pytest.skip("Ray benchmarks run under make bench only (tests/rl/test_ray_executor.py tests Ray)")


GROUPS = 64
CPU_S = 0.05


def _batch(executor: RolloutExecutor) -> float:
    builders = [WorkGroup(group_size=MEMBERS, turns=TURNS, cpu_s=CPU_S) for _ in range(GROUPS)]
    config = RolloutConfig(rollout_timeout_s=None, max_concurrent_samples=1024)
    t0 = time.perf_counter()
    out = asyncio.run(rollout_batch(builders, ScriptedPolicy(), config, executor=executor))
    elapsed = time.perf_counter() - t0
    assert all(r.group is not None for r in out)
    steps = GROUPS * MEMBERS * TURNS
    print(f"\n{type(executor).__name__}: {steps / elapsed:.1f} env steps/s ({elapsed:.1f} s)")
    return elapsed


def _with(make: Callable[[], RolloutExecutor], close: bool = True) -> float:
    executor = make()
    wait = getattr(executor, "wait_ready", None)
    if wait is not None:
        wait()  # actor start-up is not part of the throughput
    try:
        return _batch(executor)
    finally:
        if close:
            executor.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("workers", [1, 2])
def test_bench_process_pool(benchmark: object, workers: int) -> None:
    benchmark.pedantic(lambda: _with(lambda: ProcessPoolExecutor(workers)), rounds=1)  # type: ignore[attr-defined]


def test_bench_inline(benchmark: object) -> None:
    benchmark.pedantic(lambda: _batch(InlineExecutor()), rounds=1)  # type: ignore[attr-defined]


@pytest.mark.parametrize("workers", [1, 2])
def test_bench_ray(benchmark: object, workers: int) -> None:
    ray = pytest.importorskip("ray")
    from tempering.rl.ray_executor import RayExecutor

    pythonpath = os.pathsep.join([RL_DIR, *sys.path])
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    try:
        benchmark.pedantic(  # type: ignore[attr-defined]
            lambda: _with(lambda: RayExecutor(workers, max_groups_in_flight=4 * workers)), rounds=1
        )
    finally:
        ray.shutdown()
