"""Sandboxes: run untrusted code (files and a command) and report what happened.

A :class:`Sandbox` runs one command in a fresh, isolated place holding the given files, and
returns a :class:`SandboxResult`: stdout, stderr, exit code, wall time, and a ``status`` that says
whether it finished cleanly or which limit stopped it (with a ``reason`` in words). A sandbox
never raises for what the code did (a crash, a limit, a timeout are results); it raises only for
bad arguments, and a backend that cannot run anything at all reports ``"sandbox_error"``.

Implementations: ``tempering.tools.sandbox.LocalSandbox`` (a limited subprocess on this machine)
and ``SandboxFusionSandbox`` (a SandboxFusion server over HTTP). Check one with
``tempering_protocols.testing.check_sandbox``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol, get_args, runtime_checkable

import attrs

__all__ = ["SANDBOX_STATUSES", "Sandbox", "SandboxResult", "SandboxStatus"]

SandboxStatus = Literal[
    "ok",
    "error",
    "timeout",
    "cpu_limit",
    "memory_limit",
    "process_limit",
    "output_limit",
    "file_size_limit",
    "killed",
    "sandbox_error",
]
"""``ok``: exit code 0. ``error``: a non-zero exit code. ``timeout``: the wall-time limit.
``cpu_limit``, ``memory_limit``, ``process_limit``, ``output_limit`` (stdout or stderr past its
cap), ``file_size_limit``: that limit stopped it. ``killed``: another signal ended it.
``sandbox_error``: the sandbox itself failed (could not start, server unreachable)."""

SANDBOX_STATUSES: tuple[SandboxStatus, ...] = get_args(SandboxStatus)
"""Every status, in the order above."""


@attrs.frozen
class SandboxResult:
    """What one sandboxed command did.

    ``exit_code`` is ``None`` when the process did not exit by itself (killed by a signal or by
    the sandbox); ``stdout``/``stderr`` are decoded as UTF-8 (invalid bytes replaced) and cut at
    the sandbox's output cap; ``reason`` is empty when ``status == "ok"``, else one sentence;
    ``isolation`` names the protections that were in force (backend-specific, e.g.
    ``("no_network", "read_only_outside", "rlimits")``).
    """

    status: SandboxStatus
    exit_code: int | None
    stdout: str
    stderr: str
    wall_seconds: float
    reason: str = ""
    isolation: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within every limit."""
        return self.status == "ok"


@runtime_checkable
class Sandbox(Protocol):
    """Runs a command in a fresh isolated directory holding ``files``.

    ``files`` maps relative paths (``"main.py"``, ``"data/in.txt"``) to their contents;
    ``stdin`` is fed to the command; ``timeout`` (seconds) overrides the backend's wall-time
    limit for this call. Each call starts clean: nothing persists between calls.

    Example::

        result = await sandbox.run(["python3", "main.py"], files={"main.py": "print(6 * 7)"})
        result.ok, result.stdout        # True, "42\\n"
    """

    async def run(
        self,
        command: Sequence[str],
        /,
        *,
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
    ) -> SandboxResult: ...
