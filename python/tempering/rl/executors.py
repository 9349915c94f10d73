"""Where env work runs: in the event loop (default) or in worker processes.

A :class:`RolloutExecutor` *places* a group builder: it returns a builder with the same
behaviour whose envs live wherever the executor decides. The rollout runner talks only to the
placed builder, so the same runner serves every executor. Sampling always stays in the main
process; only env calls (``make_envs``, ``initial_observation``, ``step``,
``compute_group_rewards``, ``cleanup``) travel.

=============================  ==================================================================
executor                       where env calls run
=============================  ==================================================================
:class:`InlineExecutor`        the event loop of the trainer (envs that mostly await)
:class:`ProcessPoolExecutor`   ``num_workers`` spawned processes, each running its own event loop;
                               a group's envs all live in one worker (so coordinated envs work);
                               builders are pickled to get there
=============================  ==================================================================

Example::

    with ProcessPoolExecutor(num_workers=4) as executor:
        rollouts = await rollout_batch(builders_P, policy, config, executor=executor)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import pickle
import threading
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from tempering_protocols import (
    Action,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    StepResult,
    StopCondition,
    Trajectory,
)

__all__ = ["InlineExecutor", "ProcessPoolExecutor", "RemoteEnvError", "RolloutExecutor"]


@runtime_checkable
class RolloutExecutor(Protocol):
    """Decides where a group's env work runs.

    Example::

        placed = executor.place(builder)
        envs = await placed.make_envs()   # may live in another process
    """

    def place(self, builder: EnvGroupBuilder, /) -> EnvGroupBuilder: ...


@attrs.frozen
class InlineExecutor:
    """Env work in the trainer's event loop: ``place`` returns the builder itself."""

    def place(self, builder: EnvGroupBuilder, /) -> EnvGroupBuilder:
        return builder


class RemoteEnvError(RuntimeError):
    """An env call failed in a worker process; the message names the original exception.

    ``type_name`` is the original exception's type name, so failure counts stay by type.
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name


# ------------------------------------------------------------------------------ the worker


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    """Serve env calls: each request is ``(request_id, op, group_id, args)``; envs live in
    ``groups[group_id]`` between calls. Requests run concurrently on one event loop."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        groups: dict[int, tuple[EnvGroupBuilder, list[Env]]] = {}
        lock = threading.Lock()
        tasks: set[asyncio.Task[None]] = set()

        def send(msg: tuple[object, ...]) -> None:
            with lock:
                conn.send_bytes(pickle.dumps(msg))

        async def handle(rid: int, op: str, gid: int, args: tuple[object, ...]) -> None:
            try:
                result: object
                if op == "make_envs":
                    (builder_bytes,) = args
                    assert isinstance(builder_bytes, bytes)
                    builder: EnvGroupBuilder = pickle.loads(builder_bytes)
                    envs = list(await builder.make_envs())
                    if gid in groups:  # a retry's fresh envs replace the old ones by member
                        groups[gid][1].extend(envs)
                        result = (len(groups[gid][1]) - len(envs), len(envs))
                    else:
                        groups[gid] = (builder, envs)
                        result = (0, len(envs))
                elif op == "initial_observation":
                    (g,) = args
                    assert isinstance(g, int)
                    result = await groups[gid][1][g].initial_observation()
                elif op == "step":
                    g, action = args
                    assert isinstance(g, int)
                    assert isinstance(action, list)
                    result = await groups[gid][1][g].step(action)  # pyright: ignore[reportUnknownArgumentType]
                elif op == "compute_group_rewards":
                    trajectories, members = args
                    builder, envs = groups[gid]
                    result = await builder.compute_group_rewards(
                        trajectories,  # pyright: ignore[reportArgumentType]
                        [envs[g] for g in members],  # pyright: ignore[reportGeneralTypeIssues, reportUnknownVariableType]
                    )
                elif op == "cleanup":
                    entry = groups.pop(gid, None)
                    if entry is not None:
                        await entry[0].cleanup()
                    result = None
                else:
                    raise ValueError(f"unknown op {op!r}")
                send((rid, True, result))
            except Exception as exc:
                send((rid, False, (type(exc).__name__, str(exc))))

        while True:
            raw = await loop.run_in_executor(None, conn.recv_bytes)
            msg = pickle.loads(raw)
            if msg is None:
                break
            rid, op, gid, args = msg
            task = asyncio.ensure_future(handle(rid, op, gid, args))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        for task in list(tasks):
            task.cancel()

    asyncio.run(serve())


class _Worker:
    """The main-process side of one worker: sends requests, resolves futures from a reader thread."""

    def __init__(self, ctx: multiprocessing.context.SpawnContext) -> None:
        parent, child = ctx.Pipe()
        self._conn = parent
        self._process = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self._process.start()
        child.close()
        self._ids = itertools.count()
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[object]]] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.load = 0

    def _read(self) -> None:
        while True:
            try:
                rid, ok, payload = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError):
                break
            with self._lock:
                entry = self._pending.pop(rid, None)
            if entry is None:
                continue
            loop, fut = entry

            def resolve(fut: asyncio.Future[object] = fut, ok: bool = ok, payload: object = payload) -> None:
                if fut.done():
                    return
                if ok:
                    fut.set_result(payload)
                else:
                    type_name, message = payload  # pyright: ignore[reportGeneralTypeIssues]
                    fut.set_exception(RemoteEnvError(str(type_name), str(message)))  # pyright: ignore[reportUnknownArgumentType]

            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(resolve)
        with self._lock:
            pending, self._pending = self._pending, {}
        for loop, fut in pending.values():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(
                    lambda f=fut: (
                        None if f.done() else f.set_exception(RemoteEnvError("WorkerDied", "exited"))
                    )
                )

    async def call(self, op: str, gid: int, *args: object) -> object:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[object] = loop.create_future()
        rid = next(self._ids)
        with self._lock:
            self._pending[rid] = (loop, fut)
            self._conn.send_bytes(pickle.dumps((rid, op, gid, args)))
        return await fut

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send_bytes(pickle.dumps(None))
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()


class _RemoteEnv:
    """An env living in a worker process (proxy)."""

    def __init__(self, worker: _Worker, gid: int, member: int) -> None:
        self.worker, self.gid, self.member = worker, gid, member

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        out = await self.worker.call("initial_observation", self.gid, self.member)
        assert isinstance(out, tuple)
        return out  # pyright: ignore[reportUnknownVariableType]

    async def step(self, action: Action, /) -> StepResult:
        out = await self.worker.call("step", self.gid, self.member, list(action))
        assert isinstance(out, StepResult)
        return out


class _RemoteGroup(EnvGroupBuilder):
    """A builder whose envs live in a worker process (proxy, used in the main process only)."""

    def __init__(self, builder: EnvGroupBuilder, worker: _Worker, gid: int) -> None:
        self._builder, self._worker, self._gid = builder, worker, gid
        self._bytes = pickle.dumps(builder)
        self._worker.load += 1
        self._released = False

    async def make_envs(self) -> Sequence[Env]:
        out = await self._worker.call("make_envs", self._gid, self._bytes)
        assert isinstance(out, tuple)
        start, n = out  # pyright: ignore[reportUnknownVariableType]
        assert isinstance(start, int)
        assert isinstance(n, int)
        return [_RemoteEnv(self._worker, self._gid, start + g) for g in range(n)]

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        members = [e.member for e in envs_G if isinstance(e, _RemoteEnv)]
        out = await self._worker.call("compute_group_rewards", self._gid, list(trajectories_G), members)
        assert isinstance(out, list)
        return out  # pyright: ignore[reportUnknownVariableType]

    def logging_tags(self) -> list[str]:
        return self._builder.logging_tags()

    async def cleanup(self) -> None:
        try:
            await self._worker.call("cleanup", self._gid)
        finally:
            if not self._released:
                self._released = True
                self._worker.load -= 1


class ProcessPoolExecutor:
    """Env work in ``num_workers`` spawned processes; each group goes to the least-loaded worker.

    Use as a context manager (or call :meth:`close`). Builders, observations, actions and
    trajectories are pickled between processes; an exception in a worker arrives as
    :class:`RemoteEnvError` (counted as ``rollout/failed/RemoteEnvError``).

    Example::

        with ProcessPoolExecutor(num_workers=2) as executor:
            rollout = await rollout_group(builder, policy, RolloutConfig(), executor=executor)
    """

    def __init__(self, num_workers: int = 2) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        ctx = multiprocessing.get_context("spawn")
        self._workers = [_Worker(ctx) for _ in range(num_workers)]
        self._gids = itertools.count()

    def place(self, builder: EnvGroupBuilder, /) -> EnvGroupBuilder:
        worker = min(self._workers, key=lambda w: w.load)
        return _RemoteGroup(builder, worker, next(self._gids))

    def close(self) -> None:
        for worker in self._workers:
            worker.close()

    def __enter__(self) -> ProcessPoolExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
