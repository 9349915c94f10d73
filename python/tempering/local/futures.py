"""Futures and the workers that keep each client's requests in order.

Every client method that does work returns a :class:`LocalFuture` at once; the work runs on the
process's engine thread (:mod:`tempering.local.engine_thread`), each client's requests one at a
time, in submission order. That is what lets a trainer queue an ``optim_step`` behind a
``forward_backward`` before awaiting either.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, Self, TypeVar

import tinker

from tempering.local.engine_thread import engine_thread, on_engine_thread, set_torch_threads

__all__ = ["LocalFuture", "Worker", "WorkerClient", "set_torch_threads"]

_T = TypeVar("_T")


class LocalFuture(tinker.APIFuture[_T]):
    """The result of a local request: ``.result()`` in sync code, ``await`` in async code.

    A subclass of ``tinker.APIFuture``, so code that checks for the SDK's future type accepts it.

    Example::

        fut = training_client.forward_backward(data, "cross_entropy")
        out = fut.result()     # blocks
        out = await fut        # in a coroutine
    """

    __slots__ = ("_future",)

    def __init__(self, future: ConcurrentFuture[_T]) -> None:
        self._future = future

    @classmethod
    def completed(cls, value: _T) -> LocalFuture[_T]:
        """A future that already holds ``value``."""
        future: ConcurrentFuture[_T] = ConcurrentFuture()
        future.set_result(value)
        return cls(future)

    @classmethod
    def failed(cls, error: BaseException) -> LocalFuture[_T]:
        """A future that already holds ``error``."""
        future: ConcurrentFuture[_T] = ConcurrentFuture()
        future.set_exception(error)
        return cls(future)

    def result(self, timeout: float | None = None) -> _T:
        # On the engine thread (inside a request, or ``run_on_engine_thread``), waiting runs the
        # other queued requests rather than blocking the thread they need.
        if on_engine_thread():
            engine_thread().help_until(self._future, timeout)
        return self._future.result(timeout)

    async def result_async(self, timeout: float | None = None) -> _T:
        async with asyncio.timeout(timeout):
            return await asyncio.wrap_future(self._future)

    def future(self) -> ConcurrentFuture[_T]:
        return self._future

    def done(self) -> bool:
        """Whether the request has finished (successfully or not)."""
        return self._future.done()

    def __await__(self) -> Generator[Any, None, _T]:
        return self.result_async().__await__()

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<LocalFuture {state}>"


class Worker:
    """A queue on the engine thread that runs submitted calls in submission order."""

    def __init__(self, name: str) -> None:
        self._queue = engine_thread().queue(name)
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], _T]) -> LocalFuture[_T]:
        """Queue ``fn``; its return value or exception arrives through the future."""
        with self._lock:
            if self._closed:
                return LocalFuture.failed(RuntimeError("this client has been closed"))
            return LocalFuture(self._queue.submit(fn))

    def requeue(self, fn: Callable[[], object]) -> None:
        """Queue more work for calls already accepted (even after :meth:`close`)."""
        self._queue.submit(fn)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, wait: bool = True) -> None:
        """Refuse new calls; with ``wait``, finish the queued ones first (they run either way)."""
        with self._lock:
            self._closed = True
        if wait:
            self._queue.drain()


class WorkerClient:
    """A client whose requests run on its own :class:`Worker` (``_worker``): :meth:`close` and
    use as a context manager."""

    _worker: Worker

    def close(self) -> None:
        """Finish queued requests, then stop the worker thread."""
        self._worker.close(wait=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
