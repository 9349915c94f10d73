"""A small pool of checker processes, one pool per (process, size, memory limit), reused by every
grader in the process.

Each worker is a plain child process running ``_worker.py`` (not :mod:`multiprocessing`: no
re-import of ``__main__``, no fork of a threaded parent). A call checks a worker out, writes one
request line and waits for the reply with ``select`` until its deadline; a late worker is killed
(``SIGKILL``) and replaced, so the time limit bounds any sympy call, from any thread. Time spent
waiting for a free worker, or for a new worker's imports, is not charged to the call's limit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

_WORKER_SCRIPT = str(Path(__file__).with_name("_worker.py"))
_STARTUP_TIMEOUT_S = 120.0


class CheckTimeoutError(Exception):
    """The worker did not reply in time (it has been killed)."""


class CheckError(Exception):
    """The worker failed: math-verify raised, or the worker died."""


class _Worker:
    def __init__(self, memory_limit_mb: int | None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", _WORKER_SCRIPT, str(os.getpid()), str(memory_limit_mb or 0)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self._buffer = b""
        self.ready = False

    def _read_line(self, deadline: float) -> dict[str, object]:
        stdout = self.proc.stdout
        assert stdout is not None
        fd = stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CheckTimeoutError
            try:
                readable, _, _ = select.select([fd], [], [], remaining)
                chunk = os.read(fd, 65536) if readable else None
            except (OSError, ValueError) as e:  # the pool was closed meanwhile: kill() closed the pipe
                raise CheckError("the checker process exited") from e
            if chunk is None:
                raise CheckTimeoutError
            if not chunk:
                raise CheckError("the checker process exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return cast(dict[str, object], json.loads(line))

    def wait_ready(self) -> None:
        if self.ready:
            return
        reply = self._read_line(time.monotonic() + _STARTUP_TIMEOUT_S)
        if "error" in reply:
            raise ImportError(str(reply["error"]))
        self.ready = True

    def call(self, request: dict[str, object], timeout_s: float) -> bool:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps(request).encode() + b"\n")
            stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise CheckError("the checker process exited") from e
        reply = self._read_line(time.monotonic() + timeout_s)
        if "error" in reply:
            raise CheckError(str(reply["error"]))
        return bool(reply["ok"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # a dead reader: the buffered request is moot
                    stream.close()


class WorkerPool:
    """``size`` checker processes, started lazily; thread-safe."""

    def __init__(self, size: int, memory_limit_mb: int | None) -> None:
        self.size = size
        self.memory_limit_mb = memory_limit_mb
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._started = 0
        self._all: set[_Worker] = set()
        self.restarts = 0

    def _checkout(self) -> _Worker:
        while True:
            with self._lock:
                if self._idle.empty() and self._started < self.size:
                    self._started += 1
                    worker = _Worker(self.memory_limit_mb)
                    self._all.add(worker)
                    return worker
            try:  # re-check now and then: a close() meanwhile frees the slots
                return self._idle.get(timeout=0.5)
            except queue.Empty:
                continue

    def _release(self, worker: _Worker) -> None:
        """Back to the idle queue, unless the pool was closed meanwhile (then it is killed)."""
        with self._lock:
            mine = worker in self._all
            if mine:
                self._idle.put(worker)
        if not mine:
            worker.kill()

    def _retire(self, worker: _Worker) -> None:
        """Kill a worker and start its replacement now, so its imports overlap other work."""
        worker.kill()
        with self._lock:
            if worker not in self._all:  # the pool was closed meanwhile
                return
            self._all.discard(worker)
            self.restarts += 1
            replacement = _Worker(self.memory_limit_mb)
            self._all.add(replacement)
            self._idle.put(replacement)

    def check(self, request: dict[str, object], timeout_s: float) -> bool:
        worker = self._checkout()
        try:
            worker.wait_ready()
        except ImportError:
            self._retire(worker)
            raise
        except (CheckTimeoutError, CheckError) as e:
            self._retire(worker)
            raise CheckError("the checker process did not start") from e
        try:
            result = worker.call(request, timeout_s)
        except (CheckTimeoutError, CheckError) as e:
            # A late worker is still computing and a dead one is gone: replace either. A checker
            # error with a live worker leaves it usable.
            if isinstance(e, CheckTimeoutError) or worker.proc.poll() is not None:
                self._retire(worker)
            else:
                self._release(worker)
            raise
        self._release(worker)
        return result

    def warm_up(self) -> None:
        """Start every worker and wait for its imports (about a second, in parallel)."""
        workers = [self._checkout() for _ in range(self.size)]
        try:
            for worker in workers:
                worker.wait_ready()
        finally:
            for worker in workers:
                self._release(worker)

    def close(self) -> None:
        with self._lock:
            workers = list(self._all)
            self._all.clear()
            self._started = 0
            while not self._idle.empty():
                self._idle.get_nowait()
        for worker in workers:
            worker.kill()


_pools: dict[tuple[int, int, int | None], WorkerPool] = {}
_pools_lock = threading.Lock()


def shared_pool(size: int, memory_limit_mb: int | None) -> WorkerPool:
    """This process's pool of that size and memory limit (a forked child gets its own)."""
    key = (os.getpid(), size, memory_limit_mb)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = WorkerPool(size, memory_limit_mb)
        return pool


def close_pools() -> None:
    """Kill every checker process this process started (also run at exit)."""
    with _pools_lock:
        mine = [key for key in _pools if key[0] == os.getpid()]
        pools = [_pools.pop(key) for key in mine]
    for pool in pools:
        pool.close()


atexit.register(close_pools)
