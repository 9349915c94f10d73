"""The local sandbox: a limited subprocess in a fresh temporary directory (Linux).

Each :meth:`LocalSandbox.run` makes a new directory, writes the files there, and starts the
command through a small launcher (``_launch.py``, run as ``python -I -S``: a fresh
single-threaded interpreter) that isolates itself and then ``exec``s the command:

- **limits** (``setrlimit``): CPU seconds, address space (memory), file size, open files, no
  core dumps; a **wall-time** limit, and a cap on stdout and stderr, are enforced from outside;
- **processes**: a pids cgroup capped at ``max_processes`` (when the caller is root and a pids
  controller is mounted), and ``RLIMIT_NPROC`` under a uid of its own;
- **no network**: a new, empty network namespace (``unshare(CLONE_NEWNET)``; a user namespace
  too when not root);
- **nothing written outside its directory**: a private mount namespace where every mount is
  read-only except the work directory (root only), plus, as root, a fresh unprivileged uid that
  owns nothing else on the host; ``PR_SET_NO_NEW_PRIVS``;
- **a scrubbed environment**: the command sees only ``PATH``, ``HOME``/``TMPDIR`` (its
  directory), ``LANG`` and the sandbox's own ``env`` — never the caller's variables (and, under
  its own uid, not ``/proc/<caller>/environ`` either).

Which protections held is in :attr:`SandboxResult.isolation`; ``require`` turns a missing one
into a ``sandbox_error``. When the run ends, times out, overflows its output, or the awaiting
task is cancelled, every process it started is killed (its session, its cgroup, its uid) and the
directory is removed. docs/sandbox.md lists what holds where.

Example::

    sandbox = LocalSandbox(wall_seconds=5, memory_bytes=512 << 20)
    result = await sandbox.run(["python3", "main.py"], files={"main.py": "print(6 * 7)"})
    result.status, result.stdout     # "ok", "42\\n"
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from tempering.tools.sandbox._limits import PidsCgroup, kill_uid, pick_uid
from tempering_protocols.sandbox import SandboxResult, SandboxStatus

__all__ = ["ISOLATION_STEPS", "LocalSandbox", "write_files"]

_LAUNCHER = Path(__file__).with_name("_launch.py")

ISOLATION_STEPS = ("pids_cgroup", "no_network", "read_only_outside", "rlimits", "own_uid", "no_new_privs")
"""The protections the launcher applies, by the names :attr:`SandboxResult.isolation` uses."""

_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
_FORK_MARKERS = ("Resource temporarily unavailable", "BlockingIOError", "fork: retry")


def write_files(root: Path, files: Mapping[str, str | bytes]) -> None:
    """Write ``files`` (relative path → content) under ``root``; a path that is absolute or
    climbs out of ``root`` is a ``ValueError`` naming it."""
    base = root.resolve()
    for name, content in files.items():
        target = (base / name).resolve()
        if Path(name).is_absolute() or not target.is_relative_to(base) or target == base:
            raise ValueError(f"sandbox file {name!r}: must be a relative path inside the sandbox directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            target.write_text(content, encoding="utf-8")
        else:
            target.write_bytes(content)


def _chown_tree(root: Path, uid: int) -> None:
    os.chown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            os.chown(os.path.join(dirpath, name), uid, uid)


@attrs.frozen(kw_only=True)
class LocalSandbox:
    """A subprocess sandbox on this machine (Linux); satisfies ``tempering_protocols.Sandbox``.

    Picklable (plain settings); each :meth:`run` is independent, so one instance serves many
    concurrent rollouts.
    """

    wall_seconds: float = 10.0
    """Wall-clock limit of one run (``run(timeout=...)`` overrides it)."""
    cpu_seconds: int = 10
    """CPU-time limit of each process (``RLIMIT_CPU``)."""
    memory_bytes: int = 1 << 30
    """Address-space limit of each process (``RLIMIT_AS``)."""
    max_processes: int = 32
    """Processes and threads at once (pids cgroup; ``RLIMIT_NPROC`` under its own uid)."""
    max_output_bytes: int = 1 << 20
    """Cap on stdout and on stderr each; past it the run is killed (``output_limit``)."""
    max_file_bytes: int = 16 << 20
    """Largest file it may write (``RLIMIT_FSIZE``)."""
    max_open_files: int = 256
    network: bool = False
    """Allow the network (default: a new, empty network namespace)."""
    read_only_outside: bool = True
    """Make every mount but the work directory read-only (a mount namespace; needs root)."""
    own_uid: bool = True
    """As root, run under a fresh unprivileged uid (no effect otherwise)."""
    env: Mapping[str, str] = attrs.field(factory=dict[str, str])
    """Extra environment variables for the command (the caller's own are never passed)."""
    path: str = "/usr/local/bin:/usr/bin:/bin"
    """``PATH`` inside the sandbox (where ``python3`` and friends are looked up)."""
    base_dir: str | None = None
    """Where the per-run directories are made (default: the system temp directory)."""
    require: tuple[str, ...] = ()
    """Protections that must hold (names from :data:`ISOLATION_STEPS`), else ``sandbox_error``."""
    max_concurrent: int = 8
    """Runs at once per event loop (sandboxes with the same value share the bound); the rest wait."""

    def __attrs_post_init__(self) -> None:
        for name in (
            "wall_seconds", "cpu_seconds", "memory_bytes", "max_processes", "max_output_bytes",
            "max_concurrent",
        ):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ValueError(f"LocalSandbox.{name} must be > 0, got {getattr(self, name)}")
        unknown = set(self.require) - set(ISOLATION_STEPS)
        if unknown:
            raise ValueError(
                f"LocalSandbox.require: unknown protections {sorted(unknown)}; known: {list(ISOLATION_STEPS)}"
            )
        if not sys.platform.startswith("linux"):
            raise RuntimeError(
                "LocalSandbox needs Linux (setrlimit, namespaces); use SandboxFusionSandbox elsewhere"
            )

    async def run(
        self,
        command: Sequence[str],
        /,
        *,
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
    ) -> SandboxResult:
        """Run ``command`` in a fresh directory holding ``files``; see the module doc."""
        async with _slots(self.max_concurrent):
            return await self._run(command, files, stdin, timeout)

    async def _run(
        self,
        command: Sequence[str],
        files: Mapping[str, str | bytes] | None,
        stdin: str | None,
        timeout: float | None,
    ) -> SandboxResult:
        argv = [str(a) for a in command]
        if not argv:
            raise ValueError("LocalSandbox.run: command is empty; pass e.g. ['python3', 'main.py']")
        wall = self.wall_seconds if timeout is None else timeout
        if not wall > 0:
            raise ValueError(f"LocalSandbox.run: timeout must be > 0, got {timeout}")
        workdir = Path(tempfile.mkdtemp(prefix="tempering-sandbox-", dir=self.base_dir))
        cgroup = PidsCgroup(None)
        uid = pick_uid() if self.own_uid else None
        proc: asyncio.subprocess.Process | None = None
        status_r = -1
        try:
            write_files(workdir, files or {})
            if uid is not None:
                _chown_tree(workdir, uid)
            cgroup = PidsCgroup.create(self.max_processes)
            status_r, status_w = os.pipe()
            try:
                start = time.monotonic()
                spawn = asyncio.ensure_future(
                    asyncio.create_subprocess_exec(
                        sys.executable,
                        "-I",
                        "-S",
                        str(_LAUNCHER),
                        json.dumps(self._launch_config(argv, workdir, uid, cgroup, status_w)),
                        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                        pass_fds=(status_w,),
                        start_new_session=True,
                        cwd=workdir,
                        env={"LC_ALL": "C.UTF-8"},
                    )
                )
                try:
                    started = await asyncio.shield(spawn)
                except asyncio.CancelledError:
                    # cancelled while starting: get the process anyway, so the cleanup below kills it
                    proc = await spawn
                    raise
                proc = started
            finally:
                os.close(status_w)
            kill = functools.partial(_kill, started, cgroup, uid)
            outcome = await _Collect(started, self.max_output_bytes, stdin, kill).run(wall)
            wall_used = time.monotonic() - start
            _kill(started, cgroup, uid)
            launch = _read_status(status_r)
            return self._result(outcome, launch, wall_used, wall, cgroup.hit_limit())
        finally:
            # also on cancellation: nothing it started survives, and its directory goes
            _kill(proc, cgroup, uid)
            cgroup.remove()
            if status_r >= 0:
                os.close(status_r)
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(proc.wait()), 5.0)
            _close_pipes(proc)
            shutil.rmtree(workdir, ignore_errors=True)

    def _launch_config(
        self, argv: list[str], workdir: Path, uid: int | None, cgroup: PidsCgroup, status_fd: int
    ) -> dict[str, Any]:
        home = str(workdir)
        env = {
            "PATH": self.path,
            "HOME": home,
            "TMPDIR": home,
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            **self.env,
        }
        return {
            "status_fd": status_fd,
            "workdir": home,
            "argv": argv,
            "env": env,
            "require": list(self.require),
            "network": self.network,
            "read_only_outside": self.read_only_outside,
            "cgroup_procs": cgroup.procs_file,
            "uid": uid,
            # under its own uid; one above the cgroup's cap so the cgroup (which says so) acts first
            "nproc": None if uid is None else self.max_processes + (cgroup.path is not None),
            "cpu_seconds": self.cpu_seconds,
            "memory_bytes": self.memory_bytes,
            "max_file_bytes": self.max_file_bytes,
            "max_open_files": self.max_open_files,
        }

    def _result(
        self, outcome: _Outcome, launch: dict[str, Any], wall_used: float, wall: float, hit_pids: bool
    ) -> SandboxResult:
        stdout = outcome.stdout.decode("utf-8", errors="replace")
        stderr = outcome.stderr.decode("utf-8", errors="replace")
        isolation = tuple(str(x) for x in launch.get("applied", ()))
        code = outcome.returncode

        def result(status: SandboxStatus, reason: str, exit_code: int | None = None) -> SandboxResult:
            return SandboxResult(status, exit_code, stdout, stderr, wall_used, reason, isolation)

        if "error" in launch:
            return result("sandbox_error", f"the sandbox could not isolate the command: {launch['error']}")
        if not launch and code == 125:
            return result("sandbox_error", "the sandbox launcher failed before running the command")
        if outcome.overflow is not None:
            return result(
                "output_limit",
                f"{outcome.overflow} passed the {self.max_output_bytes}-byte cap; the run was killed",
            )
        forked_out = hit_pids or any(m in stderr for m in _FORK_MARKERS)
        if outcome.timed_out:
            if forked_out:
                return result(
                    "process_limit",
                    f"hit the limit of {self.max_processes} processes and ran out of wall time",
                )
            return result("timeout", f"ran past the wall-time limit of {wall:g} s; it was killed")
        if hit_pids:  # a fork was refused, even if the program coped and exited 0
            return result("process_limit", f"hit the limit of {self.max_processes} processes", code)
        if code is None or code == 0:
            return result("ok", "", code)
        if code < 0:
            sig = -code
            if sig == signal.SIGXCPU:
                return result("cpu_limit", f"used up its CPU-time limit of {self.cpu_seconds} s")
            if sig == signal.SIGXFSZ:
                return result("file_size_limit", f"wrote a file past the {self.max_file_bytes}-byte limit")
            return result("killed", f"killed by signal {signal.Signals(sig).name}")
        if "File too large" in stderr:  # Python ignores SIGXFSZ: the write fails with EFBIG
            return result("file_size_limit", f"wrote a file past the {self.max_file_bytes}-byte limit", code)
        if any(m in stderr for m in _MEMORY_MARKERS):
            return result("memory_limit", f"ran out of its {self.memory_bytes}-byte memory limit", code)
        if forked_out:
            return result("process_limit", f"hit the limit of {self.max_processes} processes", code)
        return result("error", f"exited with code {code}", code)


_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _slots(limit: int) -> asyncio.Semaphore:
    """The running loop's semaphore for ``limit`` concurrent runs."""
    per_loop = _SLOTS.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault(limit, asyncio.Semaphore(limit))


@attrs.define
class _Outcome:
    returncode: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    overflow: str | None = None
    """``"stdout"`` or ``"stderr"`` when that stream passed the cap."""


class _Collect:
    """Feeds stdin, reads both streams up to the cap, waits for the exit or the wall limit."""

    def __init__(
        self, proc: asyncio.subprocess.Process, cap: int, stdin: str | None, kill: Callable[[], None]
    ) -> None:
        self.proc = proc
        self.kill = kill
        self.cap = cap
        self.stdin = stdin
        self.outcome = _Outcome()
        self.overflowed = asyncio.Event()

    async def _read(self, stream: asyncio.StreamReader | None, name: str) -> bytes:
        if stream is None:
            return b""
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await stream.read(1 << 16)
            if not chunk:
                return b"".join(chunks)
            if size + len(chunk) > self.cap:
                chunks.append(chunk[: self.cap - size])
                if self.outcome.overflow is None:
                    self.outcome.overflow = name
                self.overflowed.set()
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)

    async def _feed(self) -> None:
        writer = self.proc.stdin
        if writer is None:
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if self.stdin:
                writer.write(self.stdin.encode("utf-8"))
                await writer.drain()
            writer.close()

    async def run(self, wall: float) -> _Outcome:
        out = asyncio.ensure_future(self._read(self.proc.stdout, "stdout"))
        err = asyncio.ensure_future(self._read(self.proc.stderr, "stderr"))
        feed = asyncio.ensure_future(self._feed())
        exited = asyncio.ensure_future(self.proc.wait())
        overflow = asyncio.ensure_future(self.overflowed.wait())
        tasks = (out, err, feed, exited, overflow)
        main = (out, err, exited)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wall
        try:
            while not overflow.done() and not all(t.done() for t in main):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self.outcome.timed_out = True
                    break
                await asyncio.wait((*main, overflow), timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if not all(t.done() for t in main):
                self.kill()
                # the streams close when the killed processes are gone (or the wait gives up)
                await asyncio.wait(main, timeout=5.0)
            self.outcome.returncode = self.proc.returncode if not self.outcome.timed_out else None
            if self.outcome.overflow is not None:
                self.outcome.returncode = None
            self.outcome.stdout = out.result() if out.done() and not out.cancelled() else b""
            self.outcome.stderr = err.result() if err.done() and not err.cancelled() else b""
            return self.outcome
        finally:
            for task in tasks:
                task.cancel()


def _close_pipes(proc: asyncio.subprocess.Process | None) -> None:
    """Close the process's pipes and transport: after a cancellation nobody reads them to EOF,
    and asyncio would otherwise leave the file descriptors open until garbage collection.
    (``Process`` has no public close; its transport is the documented ``SubprocessTransport``.)"""
    if proc is None:
        return
    transport = getattr(proc, "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


def _signal_group(proc: asyncio.subprocess.Process | None) -> None:
    if proc is None:
        return
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill(proc: asyncio.subprocess.Process | None, cgroup: PidsCgroup, uid: int | None) -> None:
    """Kill the session, then everything left in the cgroup and under the sandbox's uid."""
    _signal_group(proc)
    cgroup.kill_all()
    if uid is not None:
        kill_uid(uid)


def _read_status(fd: int) -> dict[str, Any]:
    """The launcher's status line (empty when it wrote none)."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError, OSError):
        while chunk := os.read(fd, 65536):
            data += chunk
    try:
        loaded = json.loads(data.decode() or "{}")
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}
