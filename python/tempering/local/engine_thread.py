"""One thread runs all of the local engine's work in a process.

Why one: torch's CPU wheels use GNU OpenMP, which keeps a thread pool for every thread that
starts a parallel region. Once the pools together hold more threads than there are CPUs, OpenMP
stops spin-waiting between operations and every wake-up goes through the kernel: a bfloat16
decode step of a 135M model on 2 vCPUs took 96 ms in the sampler's own thread beside the
trainer's, against 52-68 ms when one thread ran torch (docs/benchmarks.md, "Decoding on the
CPU"). So the training, sampling and loading clients of every ``ServiceClient`` in the process
share one engine thread.

Each client keeps its own queue (:class:`EngineQueue`): its requests run in submission order,
and the queues are served first come, first served. A request that waits for another one (the
server's jobs wait for their trainer; a retiring sampler waits for its weights) does not block
the thread: while it waits, the thread runs the queued requests of the other queues ("helps")
until the awaited one is done. The waiting request's own queue is not run meanwhile, so every
queue stays in order. Code outside the engine can share the thread, and so its OpenMP pool,
through :func:`run_on_engine_thread` (e.g. a reward model's forward pass, or a benchmark's
``generate``).

A fork starts the child with no engine thread; it makes its own on first use.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, TypeVar

import torch

__all__ = [
    "EngineFuture",
    "EngineQueue",
    "EngineThread",
    "engine_thread",
    "on_engine_thread",
    "run_on_engine_thread",
    "set_torch_threads",
]

_T = TypeVar("_T")
_torch_threads: int | None = None
_torch_threads_version = 0


def set_torch_threads(count: int) -> None:
    """Use ``count`` intra-op threads in torch, in this thread and on the engine thread (from
    its next request on). Process-wide (``torch.set_num_threads``).

    One thread is often fastest for small models on a busy machine: OpenMP's threads wait for
    each other at every operation, which a tiny matrix product cannot amortise.
    """
    global _torch_threads, _torch_threads_version
    if count < 1:
        raise ValueError(f"the number of threads must be >= 1, got {count}")
    _torch_threads = count
    _torch_threads_version += 1
    torch.set_num_threads(count)


class EngineFuture(ConcurrentFuture[_T]):
    """A future of a request on the engine thread. Waiting for it on the engine thread itself
    runs other queued requests meanwhile instead of blocking (see the module docstring)."""

    engine: EngineThread | None = None

    def result(self, timeout: float | None = None) -> _T:
        if self.engine is not None:
            self.engine.help_until(self, timeout)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self.engine is not None:
            self.engine.help_until(self, timeout)
        return super().exception(timeout)


class EngineQueue:
    """One client's requests, run on the engine thread in submission order."""

    def __init__(self, engine: EngineThread, name: str) -> None:
        self.engine = engine
        self.name = name
        self.last: ConcurrentFuture[Any] | None = None
        """The most recently submitted request (what :meth:`drain` waits for)."""

    def submit(self, fn: Callable[[], _T]) -> EngineFuture[_T]:
        """Queue ``fn`` behind this queue's earlier requests."""
        return self.engine.submit(self, fn)

    def drain(self) -> None:
        """Wait until every request submitted so far has run. On the engine thread, inside one
        of this queue's own requests, the rest cannot run before it returns: nothing is waited
        for (they run after it, in order)."""
        while True:
            last = self.last
            if last is None or last.done() or self.engine.is_active(self):
                return
            last.exception()  # waits (helping on the engine thread); the outcome is the caller's


_Entry = tuple[EngineQueue, Callable[[], Any], ConcurrentFuture[Any]]


class EngineThread:
    """The thread, its queue of requests and the bookkeeping for helping; see the module doc."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._entries: deque[_Entry] = deque()
        self._active: list[EngineQueue] = []
        """Queues with a request on the thread's stack (the outermost first)."""
        self._running = 0
        self._threads_version = -1
        self._thread = threading.Thread(target=self._loop, name="tempering-engine", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def queue(self, name: str) -> EngineQueue:
        return EngineQueue(self, name)

    def submit(self, queue: EngineQueue, fn: Callable[[], _T]) -> EngineFuture[_T]:
        future: EngineFuture[_T] = EngineFuture()
        future.engine = self
        with self._cond:
            self._entries.append((queue, fn, future))
            queue.last = future
            self._cond.notify_all()
        return future

    def is_active(self, queue: EngineQueue) -> bool:
        """Whether one of ``queue``'s requests is running (on the thread's stack)."""
        with self._cond:
            return queue in self._active

    def others_waiting(self) -> bool:
        """Whether a request of a queue other than the running ones is waiting to run: a long
        job (a continuous decoding batch) checks this to yield the thread between steps."""
        with self._cond:
            return self._next_index() is not None

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or running (at interpreter exit, so that a save in
        progress finishes)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._entries and self._running == 0, timeout)

    def help_until(self, future: ConcurrentFuture[_T], timeout: float | None) -> None:
        """On the engine thread: run other queues' requests until ``future`` is done (or, with
        nothing left to run, wait for it). Elsewhere: nothing (the caller blocks as usual)."""
        if threading.current_thread() is not self._thread or future.done():
            return
        future.add_done_callback(self._notify)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not future.done():
            with self._cond:
                index = self._next_index()
                if index is None:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return  # the caller's ``result(timeout)`` raises TimeoutError
                    self._cond.wait(left)
                    continue
                entry = self._take(index)
            self._run(entry)

    def _notify(self, _future: object) -> None:
        with self._cond:
            self._cond.notify_all()

    def _next_index(self) -> int | None:
        # The first request whose queue is not on the stack. Each queue's requests are in
        # order in ``_entries``, so the one found is the first of its queue.
        for i, (queue, _, _) in enumerate(self._entries):
            if queue not in self._active:
                return i
        return None

    def _take(self, index: int) -> _Entry:
        entry = self._entries[index]
        del self._entries[index]
        self._running += 1
        return entry

    def _loop(self) -> None:
        while True:
            with self._cond:
                index = self._next_index()
                while index is None:
                    self._cond.wait()
                    index = self._next_index()
                entry = self._take(index)
            self._run(entry)

    def _run(self, entry: _Entry) -> None:
        queue, fn, future = entry
        try:
            if not future.set_running_or_notify_cancel():
                return
            if self._threads_version != _torch_threads_version:
                # OpenMP keeps the thread count per thread: apply the engine's setting here too.
                self._threads_version = _torch_threads_version
                if _torch_threads is not None:
                    torch.set_num_threads(_torch_threads)
            with self._cond:
                self._active.append(queue)
            try:
                result = fn()
            except BaseException as exc:  # delivered to the waiter, as ThreadPoolExecutor does
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._cond:
                    self._active.remove(queue)
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()


_engine: EngineThread | None = None
_engine_lock = threading.Lock()


def engine_thread() -> EngineThread:
    """The process's engine thread (started on first use)."""
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = EngineThread()
        return _engine


def on_engine_thread() -> bool:
    """Whether the caller runs on the engine thread."""
    engine = _engine
    return engine is not None and threading.current_thread() is engine.thread


_shared = threading.local()


def run_on_engine_thread(fn: Callable[[], _T]) -> EngineFuture[_T]:
    """Run ``fn`` on the engine thread, after the requests already queued there; ``.result()``
    waits for it. For torch work of your own beside the engine (a reward model, an evaluation,
    a benchmark's reference), so that the process keeps one OpenMP thread pool."""
    queue: EngineQueue | None = getattr(_shared, "queue", None)
    engine = engine_thread()
    if queue is None or queue.engine is not engine:
        queue = engine.queue("user")
        _shared.queue = queue
    return queue.submit(fn)


def _reset_after_fork() -> None:
    global _engine, _engine_lock
    _engine = None
    _engine_lock = threading.Lock()


def _finish_at_exit() -> None:
    engine = _engine
    if engine is not None and not on_engine_thread():
        engine.wait_idle(timeout=600)


os.register_at_fork(after_in_child=_reset_after_fork)
atexit.register(_finish_at_exit)
