"""The filesystem, as a user meets it: one writer per directory, paths named for what they are,
and ``OSError`` turned into a sentence that names the path and the remedy.

- :class:`DirLock`: an exclusive lock on a directory (``<dir>/.lock``), held by one process at a
  time, for a run directory, a recipe's output and ``tempering serve``'s data dir. It is an
  ``flock`` on the lock file, so the kernel drops it when its process dies: a lock file left
  by a killed process is taken over (and said so at INFO), never waited on. A second process
  gets :class:`DirLockedError` naming the holder's pid, host and start time.
- :func:`path_kind`: ``"a directory"``, ``"a FIFO (named pipe)"``, ``"a symlink loop"``, ... for
  messages about a path that exists but is not what was asked for.
- :func:`describe_os_error`: ``"<path>: read-only (...); make it writable or choose another
  directory"`` for the errors a user can cause (read-only, full disk, a file in the way).

Example::

    with DirLock.acquire("runs/sft-1", what="run directory"):
        ...   # a second process: DirLockedError("runs/sft-1 is in use by pid 4242 on host ...")
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import socket
import stat
import sys
import time
from collections.abc import Generator
from pathlib import Path
from types import TracebackType

__all__ = [
    "LOCK_NAME",
    "DirLock",
    "DirLockedError",
    "blocking_file",
    "describe_os_error",
    "named_os_error",
    "naming",
    "os_error_of",
    "path_kind",
    "require_directory",
]

_log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
"""The lock file inside a locked directory (holds the holder's pid, host and start time as JSON)."""


class DirLockedError(RuntimeError):
    """Another process holds the directory's lock; the message names it (pid, host, start time)."""

    def __init__(self, message: str, holder: dict[str, object]) -> None:
        super().__init__(message)
        self.holder = holder


def path_kind(path: str | os.PathLike[str]) -> str:
    """What ``path`` is, for a message: ``"a regular file"``, ``"a directory"``, ``"a FIFO (named
    pipe)"``, ``"a socket"``, ``"a device"``, ``"a symlink loop"``, ``"a broken symlink"`` or
    ``"missing"``."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        if os.path.islink(path):
            return "a broken symlink"
        if exc.errno == errno.ENOTDIR:
            return "missing (a file is in the way of its parent directory)"
        return "missing"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def require_directory(path: str | os.PathLike[str], what: str, flag: str) -> None:
    """Refuse ``path`` if it exists as something other than a directory (``NotADirectoryError``
    naming what it is, ``what`` it was meant to be, and ``flag`` to choose another)."""
    kind = path_kind(path)
    if kind not in ("a directory", "missing"):
        raise NotADirectoryError(
            errno.ENOTDIR,
            f"the {what} {os.fspath(path)} is {kind}, not a directory; choose another {flag}",
            os.fspath(path),
        )


def blocking_file(path: str | os.PathLike[str]) -> Path | None:
    """The nearest ancestor of ``path`` (or ``path`` itself) that exists and is not a directory:
    what stops ``path`` being made as a directory (None if nothing does)."""
    start = Path(path)
    for candidate in [start, *start.parents]:
        if candidate.exists() or candidate.is_symlink():
            return None if candidate.is_dir() else candidate
    return None


def describe_os_error(
    exc: OSError, path: str | os.PathLike[str] | None = None, *, doing: str = "writing"
) -> str:
    """One sentence for ``exc``: what happened to which path, and what to do.

    ``path`` names the file when ``exc`` does not (``exc.filename`` wins when set).
    """
    name = exc.filename if exc.filename is not None else path
    where = os.fspath(name) if name is not None else "(path unknown)"
    code = exc.errno
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        reason = "read-only file system" if code == errno.EROFS else "permission denied"
        return (
            f"{doing} {where} failed: {reason}; make the directory writable, or choose another one "
            "(e.g. --run.log-dir, $TEMPERING_HOME)"
        )
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        reason = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}.get(
            code or 0, "file too large"
        )
        return (
            f"{doing} {where} failed: {reason}; free space (e.g. `tempering checkpoints prune`, "
            "--run.keep-last) and run the same command again: what was written before is kept"
        )
    if code in (errno.ENOTDIR, errno.EEXIST) and name is not None:
        blocker = blocking_file(name)
        if blocker is not None:
            return (
                f"{doing} {where} failed: {blocker} is {path_kind(blocker)} where a directory is "
                "expected; move it away, or choose another directory"
            )
    if code == errno.EISDIR:
        return f"{doing} {where} failed: it is a directory, where a file is expected"
    if code == errno.ELOOP:
        return f"{doing} {where} failed: a symlink loop"
    if code == errno.ENOENT:
        return f"{doing} {where} failed: no such file or directory"
    return f"{doing} {where} failed: {exc.strerror or exc}"


def named_os_error(exc: OSError, path: str | os.PathLike[str], *, doing: str = "writing") -> OSError:
    """``exc`` again (same class and errno), its message :func:`describe_os_error`'s sentence
    and its filename ``path`` when it had none (a failed ``write`` names no file)."""
    name = exc.filename if exc.filename is not None else os.fspath(path)
    return type(exc)(exc.errno or 0, describe_os_error(exc, name, doing=doing), name)


def os_error_of(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind ``exc``: itself, or safetensors' ``SafetensorError`` that carries
    an I/O error in its text (``... (os error 28)``), as an ``OSError`` with that errno."""
    if isinstance(exc, OSError):
        return exc
    if type(exc).__name__ == "SafetensorError":
        found = re.search(r"os error (\d+)|Os \{ code: (\d+)", str(exc))
        if found:
            code = int(found.group(1) or found.group(2))
            return OSError(code, os.strerror(code))
    return None


@contextlib.contextmanager
def naming(path: str | os.PathLike[str], *, doing: str = "writing") -> Generator[None]:
    """Re-raise a filesystem error in the block as :func:`named_os_error` of ``path``: the path,
    what happened (read-only, full disk, a file in the way) and what to do."""
    try:
        yield
    except BaseException as exc:
        error = os_error_of(exc)
        if error is None or (error is exc and getattr(exc, "_tempering_named", False)):
            raise
        named = named_os_error(error, path, doing=doing)
        named._tempering_named = True  # pyright: ignore[reportAttributeAccessIssue]
        raise named from exc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Held:
    """One process's flock on a lock file, shared by every :class:`DirLock` of that directory."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.count = 0


_HELD: dict[str, _Held] = {}
"""The locks this process holds, by the directory's real path: the lock is per process (a
second process is refused; the same process may open its own directory again, e.g. a stage
of a recipe or a resumed run in one Python session)."""


class DirLock:
    """An exclusive lock on a directory, held per process; see the module docstring.

    Use :meth:`acquire` (also a context manager); :meth:`release` is idempotent. The lock is
    dropped when the last handle of this process is released (or garbage collected), or when
    the process dies.
    """

    def __init__(self, directory: Path, key: str, what: str) -> None:
        self.directory = directory
        self.what = what
        self._key: str | None = key

    @classmethod
    def acquire(cls, directory: str | os.PathLike[str], *, what: str = "directory") -> DirLock:
        """Create ``directory`` if needed and lock it, or raise :class:`DirLockedError`.

        Raises ``OSError`` (see :func:`describe_os_error`) when the directory cannot be made or
        the lock file cannot be written.
        """
        path = Path(directory)
        with naming(path, doing=f"creating the {what}"):
            path.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(path)
        held = _HELD.get(key)
        if held is None:
            with naming(path / LOCK_NAME, doing=f"locking the {what}"):
                held = _Held(_lock_file(path, what))
            _HELD[key] = held
        held.count += 1
        return cls(path, key, what)

    def release(self) -> None:
        """Drop this handle; the last one of the process unlocks (the file stays, unlocked)."""
        key, self._key = self._key, None
        if key is None:
            return
        held = _HELD.get(key)
        if held is None:
            return
        held.count -= 1
        if held.count <= 0:
            del _HELD[key]
            os.close(held.fd)  # closing the descriptor drops the flock

    @property
    def held(self) -> bool:
        return self._key is not None

    def __enter__(self) -> DirLock:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def _lock_file(path: Path, what: str) -> int:
    """Open and flock ``path/.lock``, recording this process as the holder; its descriptor."""
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        if not _try_lock(fd):
            holder = _read_holder(fd)
            raise DirLockedError(_held_message(path, what, holder), holder)
        previous = _read_holder(fd)
        if previous and previous.get("pid") != os.getpid():
            pid = previous.get("pid")
            state = "no longer running" if isinstance(pid, int) and not _alive(pid) else "lock released"
            _log.info(
                "%s %s: taking over the lock left by pid %s on %s (%s)",
                what,
                path,
                pid,
                previous.get("host"),
                state,
            )
        _write_holder(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _try_lock(fd: int) -> bool:
    if sys.platform == "win32":  # pragma: no cover - tempering runs on POSIX
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _read_holder(fd: int) -> dict[str, object]:
    try:
        raw = os.pread(fd, 4096, 0)
        value: object = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}  # pyright: ignore[reportUnknownVariableType]


def _write_holder(fd: int) -> None:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv)[:500],
    }
    data = (json.dumps(holder) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _held_message(path: Path, what: str, holder: dict[str, object]) -> str:
    pid, host, started = holder.get("pid", "?"), holder.get("host", "?"), holder.get("started", "?")
    return (
        f"{what} {path} is in use by pid {pid} on host {host}, started {started}: one "
        "process writes a directory at a time; wait for it to finish, stop it, or choose another "
        "directory"
    )
