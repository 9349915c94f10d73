"""The cost of one env call through each executor, against calling the env directly: one group
of one :class:`ray_envs.WorkEnv` with no work in ``step``, ``N`` steps awaited one after
another (so each is a full round trip: the executor's bookkeeping, pickling the action and the
``StepResult``, the transport and the worker's dispatch). Run on demand (``make bench``) or

    .venv/bin/python -m pytest tests/benchmarks/test_bench_env_call.py --benchmark-enable -s

which prints microseconds per call for each executor and the overhead over a direct call;
docs/scaling.md plans a cluster from these figures. Under plain pytest each executor makes a few
calls (a smoke run) and Ray is skipped.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rl"))

from ray_envs import WorkGroup

from tempering.rl.executors import InlineExecutor, ProcessPoolExecutor, RolloutExecutor

RL_DIR = str(Path(__file__).resolve().parents[1] / "rl")
REPEATS = 5
_direct_us: list[float] = []


@pytest.fixture
def calls(request: pytest.FixtureRequest) -> int:
    config = request.config
    timing = bool(config.getoption("benchmark_enable")) or not config.getoption("benchmark_disable")
    if not timing and "ray" in request.node.name:
        pytest.skip("Ray benchmarks run under make bench only (tests/rl/test_ray_executor.py tests Ray)")
    return int(os.environ.get("BENCH_CALLS", "2000")) if timing else 5


async def _per_call_us(executor: RolloutExecutor, calls: int) -> tuple[float, float]:
    """Median over REPEATS of the mean wall time of one awaited ``env.step``, and of the CPU
    time the trainer's process spent on it (all its threads), in microseconds."""
    group = executor.place(WorkGroup(group_size=1, turns=10**9))
    (env,) = await group.make_envs()
    await env.initial_observation()
    for _ in range(min(calls, 50)):  # warm-up: connections, imports, caches
        await env.step([7])
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(REPEATS):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            await env.step([7])
        wall.append((time.perf_counter() - t0) / calls * 1e6)
        cpu.append((time.process_time() - c0) / calls * 1e6)
    await group.cleanup()
    return statistics.median(wall), statistics.median(cpu)


def _report(name: str, us: tuple[float, float]) -> float:
    wall, cpu = us
    direct = f", {wall - _direct_us[0]:.0f} us over a direct call" if _direct_us else ""
    print(f"\n{name}: {wall:.1f} us per env call (trainer CPU {cpu:.1f} us{direct})")
    return wall


def _measure(make: Callable[[], RolloutExecutor], name: str, calls: int) -> float:
    executor = make()
    wait = getattr(executor, "wait_ready", None)
    if wait is not None:
        wait()
    try:
        return _report(name, asyncio.run(_per_call_us(executor, calls)))
    finally:
        close = getattr(executor, "close", None)
        if close is not None:
            close()


def test_bench_call_direct(benchmark: object, calls: int) -> None:
    us = benchmark.pedantic(lambda: _measure(InlineExecutor, "direct (inline)", calls), rounds=1)  # type: ignore[attr-defined]
    _direct_us[:] = [us]


def test_bench_call_process_pool(benchmark: object, calls: int) -> None:
    benchmark.pedantic(lambda: _measure(lambda: ProcessPoolExecutor(1), "process pool", calls), rounds=1)  # type: ignore[attr-defined]


def test_bench_call_ray(benchmark: object, calls: int) -> None:
    ray = pytest.importorskip("ray")
    from tempering.rl.ray_executor import RayExecutor

    pythonpath = os.pathsep.join([RL_DIR, *sys.path])
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    try:
        benchmark.pedantic(lambda: _measure(lambda: RayExecutor(1), "Ray actor", calls), rounds=1)  # type: ignore[attr-defined]
    finally:
        ray.shutdown()
