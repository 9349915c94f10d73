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
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import pickle
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar, cast, runtime_checkable

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

__all__ = ["EnvHost", "InlineExecutor", "ProcessPoolExecutor", "RemoteEnvError", "RolloutExecutor"]

_log = logging.getLogger(__name__)

W = TypeVar("W")


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
        self.message = message


# ------------------------------------------------------------------------------ the worker


class EnvHost:
    """The envs of the groups placed on one worker, by group id, from ``make_envs`` to
    ``cleanup``: what a worker process (:class:`ProcessPoolExecutor`) and a Ray actor
    (:class:`~tempering.rl.ray_executor.RayExecutor`) serve. Each call names its group; envs
    are addressed by member.

    Example::

        host = EnvHost()
        start, n = await host.call("make_envs", gid, pickle.dumps(builder))
        ob, stop = await host.call("initial_observation", gid, start)
    """

    def __init__(self) -> None:
        self._groups: dict[int, tuple[EnvGroupBuilder, list[Env]]] = {}
        self._ops: dict[str, Callable[..., Awaitable[object]]] = {
            "make_envs": self.make_envs,
            "initial_observation": self.initial_observation,
            "step": self.step,
            "compute_group_rewards": self.compute_group_rewards,
            "cleanup": self.cleanup,
        }

    async def call(self, op: str, gid: int, *args: object) -> object:
        """The env call ``op`` (one of the methods below) on group ``gid``."""
        if op not in self._ops:
            raise ValueError(f"unknown op {op!r}; known: {', '.join(self._ops)}")
        return await self._ops[op](gid, *args)

    def _group(self, gid: int) -> tuple[EnvGroupBuilder, list[Env]]:
        if gid not in self._groups:
            raise LookupError(f"env group {gid} is not in this worker (it was restarted, or cleaned up)")
        return self._groups[gid]

    async def make_envs(self, gid: int, builder_bytes: bytes) -> tuple[int, int]:
        """``(start, n)``: the members of the group's new envs. A retry's fresh envs (the group
        is already here) are appended, addressed from ``start``, made by the group's builder."""
        entry = self._groups.get(gid)
        builder: EnvGroupBuilder = entry[0] if entry is not None else pickle.loads(builder_bytes)
        envs = list(await builder.make_envs())
        if entry is not None:
            entry[1].extend(envs)
            return len(entry[1]) - len(envs), len(envs)
        self._groups[gid] = (builder, envs)
        return 0, len(envs)

    async def initial_observation(self, gid: int, member: int) -> tuple[Observation, StopCondition]:
        return await self._group(gid)[1][member].initial_observation()

    async def step(self, gid: int, member: int, action: list[int]) -> StepResult:
        return await self._group(gid)[1][member].step(action)

    async def compute_group_rewards(
        self, gid: int, trajectories: list[Trajectory], members: list[int]
    ) -> list[tuple[float, Metrics]]:
        builder, envs = self._group(gid)
        return list(await builder.compute_group_rewards(trajectories, [envs[m] for m in members]))

    async def cleanup(self, gid: int) -> None:
        entry = self._groups.pop(gid, None)
        if entry is not None:
            await entry[0].cleanup()


_READY = -1
"""The request id of the message a worker sends once it is ready to serve."""


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    """Serve env calls: each request is ``(request_id, op, group_id, args)``, an
    :class:`EnvHost` call. Requests run concurrently on one event loop; a request
    ``(request_id, "cancel", ...)`` cancels request ``request_id`` (a rollout that timed out)."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        host = EnvHost()
        lock = threading.Lock()
        tasks: dict[int, asyncio.Task[None]] = {}

        def send(msg: tuple[object, ...]) -> None:
            with lock:
                conn.send_bytes(pickle.dumps(msg))

        async def handle(rid: int, op: str, gid: int, args: tuple[object, ...]) -> None:
            try:
                send((rid, True, await host.call(op, gid, *args)))
            except asyncio.CancelledError:
                send((rid, False, ("CancelledError", "cancelled by the trainer (the rollout timed out)")))
            except Exception as exc:
                send((rid, False, (type(exc).__name__, str(exc))))
            finally:
                tasks.pop(rid, None)

        send((_READY, True, None))
        while True:
            raw = await loop.run_in_executor(None, conn.recv_bytes)
            msg = pickle.loads(raw)
            if msg is None:
                break
            rid, op, gid, args = msg
            if op == "cancel":
                target = tasks.get(rid)
                if target is not None:
                    target.cancel()
                continue
            tasks[rid] = asyncio.ensure_future(handle(rid, op, gid, args))
        for task in list(tasks.values()):
            task.cancel()

    asyncio.run(serve())


class _Process:
    """One spawned worker process and the thread that reads its replies into futures."""

    def __init__(self, ctx: multiprocessing.context.SpawnContext) -> None:
        parent, child = ctx.Pipe()
        self.conn = parent
        self.process = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[object]]] = {}
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.died_because = "exited"
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                rid, ok, payload = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                break
            if rid == _READY:
                self.ready.set()
                continue
            with self.lock:
                entry = self.pending.pop(rid, None)
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
        self.ready.set()  # nobody waits for a process that is gone
        with self.lock:
            pending, self.pending = self.pending, {}
        for loop, fut in pending.values():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(
                    lambda f=fut: (
                        None if f.done() else f.set_exception(RemoteEnvError("WorkerDied", self.died_because))
                    )
                )

    def send(self, msg: object) -> None:
        with self.lock:
            self.conn.send_bytes(pickle.dumps(msg))

    def stop(self, kill: bool) -> None:
        if not kill:
            with contextlib.suppress(OSError):
                self.send(None)
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self._reader.join(timeout=5)
        self.conn.close()


class _Worker:
    """The main-process side of one worker slot: sends requests; restarts the process when an
    env call blocks its event loop (a cancelled request is not acknowledged within
    ``cancel_grace_s``), so a rollout timeout bounds a step whatever the env does."""

    def __init__(self, ctx: multiprocessing.context.SpawnContext, cancel_grace_s: float) -> None:
        self._ctx = ctx
        self._grace = cancel_grace_s
        self._proc = _Process(ctx)
        self.generation = 0
        self._ids = itertools.count()
        self.load = 0

    def wait_ready(self, timeout: float) -> bool:
        return self._proc.ready.wait(timeout)

    async def call(self, op: str, gid: int, *args: object) -> object:
        proc = self._proc
        if not proc.ready.is_set():
            await asyncio.to_thread(proc.ready.wait, 300)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[object] = loop.create_future()
        rid = next(self._ids)
        with proc.lock:
            proc.pending[rid] = (loop, fut)
        proc.send((rid, op, gid, args))
        try:
            return await fut
        except asyncio.CancelledError:
            if rid in proc.pending and proc.process.is_alive():
                with contextlib.suppress(OSError):
                    proc.send((rid, "cancel", gid, ()))
                loop.call_later(self._grace, self._check_cancelled, proc, rid, op)
            raise

    def _check_cancelled(self, proc: _Process, rid: int, op: str) -> None:
        """A cancelled request still unanswered after the grace period: the worker's event loop
        is blocked (an env that calls ``time.sleep`` or computes without awaiting); restart it."""
        if proc is not self._proc or rid not in proc.pending:
            return
        proc.died_because = (
            f"restarted: an env call ({op}) did not yield within {self._grace:g} s of its rollout "
            "timing out (it blocks the worker's event loop: use `await asyncio.sleep`, or "
            "`asyncio.to_thread` for blocking work)"
        )
        _log.warning("env worker %s", proc.died_because)
        self._proc = _Process(self._ctx)
        self.generation += 1
        proc.stop(kill=True)

    def close(self) -> None:
        self._proc.stop(kill=False)


class RemoteEnv(Generic[W]):
    """An env living in another process (proxy): member ``member`` of group ``gid`` on
    ``worker``, reached by ``call(op, gid, *args)`` (the process pool's and Ray's executors)."""

    def __init__(self, call: Callable[..., Awaitable[object]], worker: W, gid: int, member: int) -> None:
        self.call, self.worker, self.gid, self.member = call, worker, gid, member

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        out = await self.call("initial_observation", self.gid, self.member)
        return cast("tuple[Observation, StopCondition]", out)

    async def step(self, action: Action, /) -> StepResult:
        out = await self.call("step", self.gid, self.member, list(action))
        assert isinstance(out, StepResult)
        return out


class _RemoteGroup(EnvGroupBuilder):
    """A builder whose envs live in a worker process (proxy, used in the main process only)."""

    def __init__(self, builder: EnvGroupBuilder, worker: _Worker, gid: int) -> None:
        self._builder, self._worker, self._gid = builder, worker, gid
        self._bytes = pickle.dumps(builder)
        self._worker.load += 1
        self._released = False
        self._generation = worker.generation

    async def make_envs(self) -> Sequence[Env]:
        self._generation = self._worker.generation
        out = await self._worker.call("make_envs", self._gid, self._bytes)
        assert isinstance(out, tuple)
        start, n = out  # pyright: ignore[reportUnknownVariableType]
        assert isinstance(start, int)
        assert isinstance(n, int)
        return [RemoteEnv(self._worker.call, self._worker, self._gid, start + g) for g in range(n)]

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        members = [e.member for e in envs_G if isinstance(e, RemoteEnv)]
        out = await self._worker.call("compute_group_rewards", self._gid, list(trajectories_G), members)
        assert isinstance(out, list)
        return out  # pyright: ignore[reportUnknownVariableType]

    def logging_tags(self) -> list[str]:
        return self._builder.logging_tags()

    async def cleanup(self) -> None:
        try:
            if self._worker.generation == self._generation:  # else its envs went with the process
                await self._worker.call("cleanup", self._gid)
        finally:
            if not self._released:
                self._released = True
                self._worker.load -= 1


class ProcessPoolExecutor:
    """Env work in ``num_workers`` spawned processes; each group goes to the least-loaded worker.

    Use as a context manager (or call :meth:`close`). Builders, observations, actions and
    trajectories are pickled between processes; an exception in a worker arrives as
    :class:`RemoteEnvError` (counted by the original exception's type name).

    A rollout that times out cancels its env call in the worker. When the worker does not
    answer the cancellation within ``cancel_grace_s`` (an env call blocks its event loop, e.g.
    ``time.sleep`` in ``step``), the worker process is killed and a fresh one started: the groups
    that lived in it fail (``rollout/failed/WorkerDied``), and ``rollout_timeout_s`` bounds the
    step. The workers are started (and waited for, up to ``start_timeout_s``) on construction.

    Example::

        with ProcessPoolExecutor(num_workers=2) as executor:
            rollout = await rollout_group(builder, policy, RolloutConfig(), executor=executor)
    """

    def __init__(
        self, num_workers: int = 2, *, cancel_grace_s: float = 5.0, start_timeout_s: float = 300.0
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not cancel_grace_s > 0:
            raise ValueError(f"cancel_grace_s must be > 0, got {cancel_grace_s}")
        ctx = multiprocessing.get_context("spawn")
        self._workers = [_Worker(ctx, cancel_grace_s) for _ in range(num_workers)]
        self._gids = itertools.count()
        # Started before the first rollout, so a worker's start-up never counts against a timeout.
        for i, worker in enumerate(self._workers):
            if not worker.wait_ready(start_timeout_s):
                self.close()
                raise RuntimeError(f"env worker {i} did not start within {start_timeout_s:g} s")

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
