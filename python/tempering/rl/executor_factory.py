"""Choosing the executor an RL run asks for (``RLConfig.env_workers`` / ``ray_workers``)."""

from __future__ import annotations

from tempering.rl.executors import InlineExecutor, ProcessPoolExecutor, RolloutExecutor
from tempering.rl.ray_executor import RayExecutor

__all__ = ["executor_metrics", "make_executor"]


def make_executor(
    env_workers: int = 0, ray_workers: int = 0, ray_address: str | None = None
) -> tuple[RolloutExecutor, ProcessPoolExecutor | RayExecutor | None]:
    """The executor an RL config asks for, and the one to close at the end (``None`` inline):
    ``ray_workers > 0``: a :class:`~tempering.rl.ray_executor.RayExecutor`; else
    ``env_workers > 0``: a :class:`ProcessPoolExecutor`; else :class:`InlineExecutor`."""
    if ray_workers > 0:
        ray = RayExecutor(ray_workers, address=ray_address)
        return ray, ray
    if env_workers > 0:
        pool = ProcessPoolExecutor(env_workers)
        return pool, pool
    return InlineExecutor(), None


def executor_metrics(executor: RolloutExecutor) -> dict[str, float]:
    """The executor's own counters, logged with each RL step: ``ray/workers``,
    ``ray/queue_depth``, ``ray/transit_s``, … on Ray (:meth:`RayExecutor.metrics`); none else."""
    return executor.metrics() if isinstance(executor, RayExecutor) else {}
