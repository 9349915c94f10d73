"""Futures and the single-thread workers that keep each client's requests in order.

Every client method that does work returns a :class:`LocalFuture` at once; the work runs on the
client's own worker thread, one request at a time, in submission order. That is what lets a
trainer queue an ``optim_step`` behind a ``forward_backward`` before awaiting either.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Generator
from concurrent.futures import Future as ConcurrentFuture
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self, TypeVar

import tinker
import torch

__all__ = ["LocalFuture", "Worker", "WorkerClient", "new_executor", "set_torch_threads"]

_T = TypeVar("_T")
_worker_ids = itertools.count()
_torch_threads: int | None = None


def set_torch_threads(count: int) -> None:
    """Use ``count`` intra-op threads in torch, in this thread and in every worker thread the
    local engine starts from now on. Process-wide (``torch.set_num_threads``).

    One thread is often fastest for small models on a busy machine: OpenMP's threads wait for
    each other at every operation, which a tiny matrix product cannot amortise.
    """
    global _torch_threads
    if count < 1:
        raise ValueError(f"the number of threads must be >= 1, got {count}")
    _torch_threads = count
    torch.set_num_threads(count)


def _init_worker_thread() -> None:
    # OpenMP keeps the thread count per thread: repeat the setting in each new worker.
    if _torch_threads is not None:
        torch.set_num_threads(_torch_threads)


def new_executor(name: str) -> ThreadPoolExecutor:
    """A single-thread executor whose thread uses the engine's torch thread setting."""
    return ThreadPoolExecutor(
        max_workers=1,
        thread_name_prefix=f"tempering-{name}-{next(_worker_ids)}",
        initializer=_init_worker_thread,
    )


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
    """One thread that runs submitted calls in submission order."""

    def __init__(self, name: str) -> None:
        self._executor = new_executor(name)
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], _T]) -> LocalFuture[_T]:
        """Queue ``fn``; its return value or exception arrives through the future."""
        with self._lock:
            if self._closed:
                return LocalFuture.failed(RuntimeError("this client has been closed"))
            return LocalFuture(self._executor.submit(fn))

    def close(self, wait: bool = True) -> None:
        """Refuse new calls; with ``wait``, finish the queued ones first."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=wait)


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
