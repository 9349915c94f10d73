"""Env work on a Ray cluster: :class:`RayExecutor`.

Each group's envs live in one Ray actor for the group's whole life (``make_envs`` …
``cleanup``), so envs that coordinate with each other (games, shared simulators) still work.
Sampling stays in the trainer; only env calls travel, as with the process pool
(:mod:`tempering.rl.executors`): builders are pickled once when placed, observations, actions
and trajectories travel with Ray's serializer.

- **Cluster**: ``RayExecutor()`` starts a local Ray (``ray.init()``) unless one is running;
  ``address="auto"`` or ``"ray://host:10001"`` joins an existing cluster (``ray start --head``,
  KubeRay). An executor that started Ray shuts it down on :meth:`close`.
- **Workers**: ``num_workers`` actors, each reserving ``resources`` (``{"CPU": 1}`` by default;
  memory in bytes as ``"memory"``, custom resources such as ``{"sandbox": 1}`` by name). A
  group goes to the least-loaded actor.
- **Backpressure**: at most ``max_groups_in_flight`` groups hold envs at once (default:
  ``2 * num_workers``); more wait for a slot, counted as the queue depth.
- **Faults**: a call to an actor that died raises :class:`RemoteEnvError` (``WorkerDied``),
  which the rollout counts and retries within ``RolloutConfig.max_retries``: the retry's
  ``make_envs`` moves the group to a live actor. Dead actors are replaced
  (``restart_workers=True``, the default); with ``restart_workers=False`` the executor raises
  :class:`WorkersLostError` once none is left, so a run stops with that message.
- **Metrics** (:meth:`metrics`): ``ray/workers``, ``ray/queue_depth``, ``ray/groups_in_flight``,
  ``ray/calls``, ``ray/transit_s`` (mean time per call outside the env: serialization and
  transport), ``ray/worker_restarts``.

Example::

    with RayExecutor(num_workers=4, resources={"CPU": 1, "sandbox": 1}) as executor:
        rollouts = await rollout_batch(builders_P, policy, config, executor=executor)
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import pickle
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from tempering.rl.executors import EnvHost, RemoteEnv, RemoteEnvError
from tempering_protocols import Env, EnvGroupBuilder, Metrics, Trajectory

__all__ = ["RayExecutor", "WorkersLostError"]


class WorkersLostError(RuntimeError):
    """Every Ray worker of an executor died and ``restart_workers`` is off."""


def _ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "RayExecutor needs Ray: pip install 'tempering[ray]' (or use env_workers for processes)"
        ) from exc
    return ray


class _EnvHost:
    """The actor: an :class:`EnvHost` whose calls also return their time inside (runs in Ray)."""

    def __init__(self) -> None:
        self.host = EnvHost()

    async def call(self, op: str, gid: int, *args: object) -> tuple[object, float]:
        t0 = time.perf_counter()
        out = await self.host.call(op, gid, *args)
        return out, time.perf_counter() - t0

    def pid(self) -> int:
        import os

        return os.getpid()


class _Worker:
    """The trainer's handle on one actor."""

    def __init__(self, handle: Any, index: int) -> None:
        self.handle = handle
        self.index = index
        self.load = 0
        self.dead = False


class RayExecutor:
    """Env work in Ray actors (see the module docstring). Use as a context manager."""

    def __init__(
        self,
        num_workers: int = 2,
        *,
        address: str | None = None,
        resources: Mapping[str, float] | None = None,
        max_groups_in_flight: int | None = None,
        restart_workers: bool = True,
        init_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if max_groups_in_flight is not None and max_groups_in_flight < 1:
            raise ValueError(f"max_groups_in_flight must be >= 1, got {max_groups_in_flight}")
        ray = _ray()
        self._started_ray = False
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=True, **dict(init_kwargs or {}))
            self._started_ray = address is None
        wanted = dict(resources) if resources is not None else {"CPU": 1.0}
        self._options: dict[str, Any] = {
            "num_cpus": wanted.pop("CPU", 0.0),
            "num_gpus": wanted.pop("GPU", 0.0),
            "max_concurrency": 1000,
            "max_restarts": 0,
        }
        memory = wanted.pop("memory", None)
        if memory is not None:
            self._options["memory"] = memory
        if wanted:
            self._options["resources"] = wanted
        self._actor_class = ray.remote(_EnvHost)
        self.restart_workers = restart_workers
        self._workers = [self._start(i) for i in range(num_workers)]
        self._next_index = itertools.count(num_workers)
        self._gids = itertools.count()
        self.max_groups_in_flight = max_groups_in_flight or 2 * num_workers
        self._slots: asyncio.Semaphore | None = None
        self._waiting = 0
        self._in_flight = 0
        self._calls = 0
        self._transit_s = 0.0
        self.worker_restarts = 0
        self._closed = False

    def _start(self, index: int) -> _Worker:
        self._num_started = getattr(self, "_num_started", 0) + 1
        return _Worker(self._actor_class.options(**self._options).remote(), index)

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Block until every actor has started (its process is up): for benchmarks, and to
        keep start-up out of the first rollout's time limits."""
        ray = _ray()
        ray.get([w.handle.pid.remote() for w in self._workers if not w.dead], timeout=timeout)

    @property
    def actors(self) -> list[Any]:
        """The live actor handles (for tests and diagnostics)."""
        return [w.handle for w in self._workers if not w.dead]

    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_groups_in_flight)
        return self._slots

    def pick(self) -> _Worker:
        """The least-loaded live worker (replacing dead ones when allowed)."""
        live = [w for w in self._workers if not w.dead]
        if not live:
            raise WorkersLostError(
                f"all {self._num_started} Ray workers died and restart_workers is off; "
                "check the cluster (ray status), or allow restarts"
            )
        return min(live, key=lambda w: w.load)

    def mark_dead(self, worker: _Worker) -> None:
        if worker.dead:
            return
        worker.dead = True
        if self.restart_workers and not self._closed:
            self._workers.append(self._start(next(self._next_index)))
            self.worker_restarts += 1
        self._workers = [w for w in self._workers if not w.dead or w.load > 0]

    async def call(self, worker: _Worker, method: str, *args: object) -> object:
        """The env call ``method`` (:meth:`EnvHost.call`) on ``worker``'s actor; a dead actor becomes
        ``RemoteEnvError``."""
        ray = _ray()
        t0 = time.perf_counter()
        try:
            result, inside = await worker.handle.call.remote(method, *args)
        except ray.exceptions.RayActorError as exc:
            self.mark_dead(worker)
            raise RemoteEnvError("WorkerDied", f"Ray worker {worker.index} died: {exc}") from exc
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else exc
            raise RemoteEnvError(type(cause).__name__, str(cause)) from exc
        self._calls += 1
        self._transit_s += max(0.0, time.perf_counter() - t0 - float(inside))
        return result

    def place(self, builder: EnvGroupBuilder, /) -> EnvGroupBuilder:
        if self._closed:
            raise RuntimeError("this RayExecutor is closed")
        return _RayGroup(builder, self, next(self._gids))

    def metrics(self) -> dict[str, float]:
        """The executor's counters (see the module docstring)."""
        return {
            "ray/workers": float(sum(not w.dead for w in self._workers)),
            "ray/queue_depth": float(self._waiting),
            "ray/groups_in_flight": float(self._in_flight),
            "ray/calls": float(self._calls),
            "ray/transit_s": self._transit_s / self._calls if self._calls else 0.0,
            "ray/worker_restarts": float(self.worker_restarts),
        }

    def close(self) -> None:
        """Kill every actor; shut Ray down if this executor started it."""
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        killed = [w.handle for w in self._workers if not w.dead]
        for w in self._workers:
            if not w.dead:
                ray.kill(w.handle, no_restart=True)
                w.dead = True
        _wait_until_dead(ray, killed)
        if self._started_ray:
            ray.shutdown()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait_until_dead(ray: Any, handles: list[Any], timeout: float = 30.0) -> None:
    """Return once every killed actor refuses calls (``ray.kill`` is asynchronous: a call sent
    just after it can still be served), or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pending = list(handles)
    while pending and time.monotonic() < deadline:
        still: list[Any] = []
        for handle in pending:
            try:
                ray.get(handle.pid.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except ray.exceptions.RayActorError:
                continue
            except ray.exceptions.GetTimeoutError:
                pass
            still.append(handle)
        pending = still
        if pending:
            time.sleep(0.05)


class _RayGroup(EnvGroupBuilder):
    """A builder whose envs live in a Ray actor (proxy, in the trainer only)."""

    def __init__(self, builder: EnvGroupBuilder, executor: RayExecutor, gid: int) -> None:
        self._builder, self.executor, self.gid = builder, executor, gid
        self._bytes = pickle.dumps(builder)
        self._worker: _Worker | None = None
        self._holds_slot = False
        self._lock: asyncio.Lock | None = None

    async def make_envs(self) -> Sequence[Env]:
        ex = self.executor
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._holds_slot:
                ex._waiting += 1
                try:
                    await ex.slots().acquire()
                finally:
                    ex._waiting -= 1
                self._holds_slot = True
                ex._in_flight += 1
            # make_envs itself moves to a live actor when its actor died before answering
            # (nothing had run there yet); deaths later in the episode are the rollout's retries.
            for attempt in range(3):
                if self._worker is None or self._worker.dead:
                    if self._worker is not None:
                        self._worker.load -= 1
                    self._worker = ex.pick()
                    self._worker.load += 1
                worker = self._worker
                try:
                    out = await ex.call(worker, "make_envs", self.gid, self._bytes)
                    break
                except RemoteEnvError as exc:
                    if exc.type_name != "WorkerDied" or attempt == 2 or not ex.restart_workers:
                        raise
        start, n = cast("tuple[int, int]", out)  # pyright: ignore[reportPossiblyUnboundVariable]
        call = functools.partial(ex.call, worker)  # pyright: ignore[reportPossiblyUnboundVariable]
        return [RemoteEnv(call, worker, self.gid, start + g) for g in range(n)]  # pyright: ignore[reportPossiblyUnboundVariable]

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        remote = [e for e in envs_G if isinstance(e, RemoteEnv)]
        workers = {e.worker.index for e in remote if isinstance(e.worker, _Worker)}
        if self._worker is None or workers - {self._worker.index}:
            raise RemoteEnvError("WorkerDied", "the group's envs were lost with a Ray worker")
        members = [e.member for e in remote]
        out = await self.executor.call(
            self._worker, "compute_group_rewards", self.gid, list(trajectories_G), members
        )
        return cast("list[tuple[float, Metrics]]", out)

    def logging_tags(self) -> list[str]:
        return self._builder.logging_tags()

    async def cleanup(self) -> None:
        ex = self.executor
        try:
            if self._worker is not None and not self._worker.dead:
                await ex.call(self._worker, "cleanup", self.gid)
        finally:
            if self._worker is not None:
                self._worker.load -= 1
                self._worker = None
            if self._holds_slot:
                self._holds_slot = False
                ex._in_flight -= 1
                ex.slots().release()
