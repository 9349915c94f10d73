"""The local sandbox's process bookkeeping: its pids cgroup, its uid, killing everything it started.

Kept apart from :mod:`.local` so that file stays about running and reporting. Linux only; every
function degrades to doing nothing where the kernel or the privileges do not allow it.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["ISSUED_UIDS", "PidsCgroup", "kill_uid", "live_pids_of", "pick_uid"]

_UID_BASE = 0x5A000000
"""Sandbox uids are drawn from ``[_UID_BASE, _UID_BASE + 2**24)``: far above any real account,
so a sandbox's uid owns nothing on the host and shares its process count with no one."""

_CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))
"""cgroup v1's pids hierarchy, then the cgroup v2 root."""


ISSUED_UIDS: collections.deque[int] = collections.deque(maxlen=4096)
"""The uids this process gave its sandboxes, most recent last (for checking that none lives on)."""


def pick_uid() -> int | None:
    """A fresh unused uid for one sandbox when running as root (it can drop to it), else None."""
    if os.geteuid() != 0:
        return None
    uid = _UID_BASE + secrets.randbelow(1 << 24)
    ISSUED_UIDS.append(uid)
    return uid


class PidsCgroup:
    """A pids cgroup capping one sandbox's process count, or nothing where none can be made.

    Example::

        group = PidsCgroup.create(max_processes=32)
        group.procs_file     # the launcher writes its pid there (None: no cgroup here)
        group.kill_all(); group.remove()
    """

    _usable: bool | None = None
    """Class-wide: whether creating one worked before (None: not tried yet)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    @classmethod
    def create(cls, max_processes: int) -> PidsCgroup:
        if cls._usable is False or os.geteuid() != 0:
            return cls(None)
        for root in _CGROUP_ROOTS:
            if not (root / "cgroup.procs").is_file():
                continue
            path = root / f"tempering-sandbox-{os.getpid()}-{secrets.token_hex(6)}"
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                (path / "pids.max").write_text(str(max_processes))
            except OSError:
                with contextlib.suppress(OSError):
                    path.rmdir()
                continue
            cls._usable = True
            return cls(path)
        cls._usable = False
        return cls(None)

    @property
    def procs_file(self) -> str | None:
        return None if self.path is None else str(self.path / "cgroup.procs")

    def hit_limit(self) -> bool:
        """Whether a fork was refused because the cgroup was full."""
        if self.path is None:
            return False
        try:
            for line in (self.path / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max" and int(value) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    def pids(self) -> list[int]:
        if self.path is None:
            return []
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup until it is empty (the pids cap bounds each round)."""
        kill_until_gone(self.pids, rounds=200)

    def remove(self) -> None:
        if self.path is None:
            return
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                self.kill_all()
                time.sleep(0.01)


def _uid_of(pid_dir: Path) -> int | None:
    """The real uid of a live process (None for a zombie: it is dead, waiting to be reaped)."""
    try:
        lines = (pid_dir / "status").read_text().splitlines()
        if any(line.startswith("State:") and "Z" in line.split()[1] for line in lines):
            return None
        for line in lines:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def live_pids_of(uids: set[int]) -> list[int]:
    """The live processes (not zombies) whose real uid is in ``uids``."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _uid_of(entry) in uids
    ]


def kill_until_gone(pids: Callable[[], list[int]], *, rounds: int) -> None:
    """SIGKILL the processes ``pids()`` lists, again and again (at most ``rounds`` times, 5 ms
    apart) until it lists none (forks made meanwhile are caught by the next round)."""
    for _ in range(rounds):
        found = pids()
        if not found:
            return
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def kill_uid(uid: int) -> None:
    """SIGKILL every live process whose real uid is ``uid`` (a sandbox's own uid), until none is left."""
    kill_until_gone(lambda: live_pids_of({uid}), rounds=50)
