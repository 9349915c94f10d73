"""A test helper shipped with the server: ``tempering serve`` in a subprocess on a free loopback
port, for your own tests of code written against the ``tinker`` SDK (and for ours)."""

from __future__ import annotations

import contextlib
import gc
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

__all__ = ["API_KEY", "ServerProcess", "collect_sdk_garbage"]

API_KEY = "tml-serve-tests"
"""The key :class:`ServerProcess` starts the server with."""
_START_TIMEOUT_S = 120.0


class ServerProcess:
    """``tempering serve`` on a free loopback port (``--port 0``); :meth:`stop` always ends it.

    Example::

        server = ServerProcess(data_dir, home).start()
        try:
            client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
        finally:
            server.stop()
    """

    def __init__(self, data_dir: Path, home: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.home = home
        self.extra = extra
        self.url = ""
        self.returncode: int | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str] = queue.Queue()
        self._pump_thread: threading.Thread | None = None
        self.log: list[str] = []

    def start(self) -> ServerProcess:
        env = dict(os.environ)
        env.update(
            TEMPERING_HOME=str(self.home),
            TEMPERING_NUM_THREADS="1",
            TEMPERING_DEVICE="cpu",
            TEMPERING_DTYPE="float32",
            PYTHONUNBUFFERED="1",
        )
        command = [sys.executable, "-m", "tempering.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
        command += ["--api-key", API_KEY, "--data-dir", str(self.data_dir), *self.extra]
        self._proc = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                if self._proc.poll() is not None:
                    break
                continue
            if line.startswith("listening on "):
                self.url = line.removeprefix("listening on ").strip()
                return self
        self.stop()
        raise RuntimeError(f"the server did not start: {''.join(self.log)}")

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def _pump(self) -> None:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return
        for line in proc.stdout:
            self.log.append(line)
            self._lines.put(line)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited after ``timeout`` seconds."""
        proc = self._proc
        if proc is None:
            return self.returncode
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.returncode = proc.returncode
        if self._pump_thread is not None:  # the log is complete once the pipe has ended
            self._pump_thread.join(10)
        if proc.stdout is not None:
            proc.stdout.close()
        self._proc = None
        return self.returncode


def collect_sdk_garbage(seconds: float = 1.0) -> None:
    """Let the tinker SDK's clients finish closing and collect them, ignoring the
    ``ResourceWarning`` of the connection pool that tinker 0.38 opens for ``/client/config``
    and never closes. Call it when a test module's clients are done, so the warning cannot fire
    later inside an unrelated test (or at the end of the session, where pytest makes it an error).
    """
    import asyncio

    from tinker._client import AsyncTinker
    from tinker.lib.internal_client_holder import _internal_client_holder_thread_singleton

    loop = _internal_client_holder_thread_singleton.loop_if_started()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "unclosed", ResourceWarning)
        if loop is not None:
            for client in [o for o in gc.get_objects() if type(o) is AsyncTinker]:
                if not client.is_closed():
                    with contextlib.suppress(Exception):
                        asyncio.run_coroutine_threadsafe(client.close(), loop).result(5)
        deadline = time.monotonic() + seconds
        while True:
            gc.collect()
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
