"""Conformance checks for ``Sandbox``: results, exit codes, fresh directories, timeouts.

The check runs four small Python programs (``python3`` must be on the sandbox's ``PATH``):
one that reads a file and stdin, one that exits 3, one that leaves a file behind followed by
one that looks for it, and one that sleeps past a 1-second timeout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from tempering_protocols.sandbox import Sandbox, SandboxResult, SandboxStatus
from tempering_protocols.testing._base import ConformanceError, acall, expect_type, name_of, run_sync
from tempering_protocols.testing._structure import check_object_implements

__all__ = ["KIT_PROGRAMS", "acheck_sandbox", "check_sandbox"]

KIT_PROGRAMS: Mapping[str, str] = {
    "echo": "import sys\nprint(open('data/in.txt').read().strip() + sys.stdin.read().strip())\n",
    "exit": "import sys\nsys.exit(3)\n",
    "leave": "open('leftover.txt', 'w').write('x')\n",
    "look": "import os\nprint('stale' if os.path.exists('leftover.txt') else 'fresh')\n",
    "sleep": "import time\ntime.sleep(30)\n",
}
"""The programs the check runs, as ``main.py``, by name."""


def _expect_result(value: object, what: str) -> SandboxResult:
    if not isinstance(value, SandboxResult):
        raise ConformanceError(
            "sandbox/return-type", f"{what} returned {type(value).__name__}, not SandboxResult"
        )
    rule = "sandbox/return-type"
    expect_type(value.status, SandboxStatus, rule=rule, what=f"{what}: status must be a SandboxStatus")
    expect_type(value.exit_code, int | None, rule=rule, what=f"{what}: exit_code must be an int or None")
    expect_type(
        (value.stdout, value.stderr), tuple[str, str], rule=rule, what=f"{what}: stdout/stderr must be str"
    )
    expect_type(value.wall_seconds, float | int, rule=rule, what=f"{what}: wall_seconds must be a number")
    if not (math.isfinite(value.wall_seconds) and value.wall_seconds >= 0):
        raise ConformanceError(
            rule, f"{what}: wall_seconds must be finite and >= 0, got {value.wall_seconds}"
        )
    return value


async def acheck_sandbox(sandbox: object, /, *, python: str = "python3") -> None:
    """Check ``sandbox`` (a ``Sandbox``) with the kit's programs; raise ``ConformanceError``.

    Example::

        await acheck_sandbox(LocalSandbox())
    """
    check_object_implements(sandbox, Sandbox)
    name = name_of(sandbox)
    box: Sandbox = sandbox  # pyright: ignore[reportAssignmentType]

    async def run(program: str, *, stdin: str | None = None, timeout: float | None = None) -> SandboxResult:
        files = {"main.py": KIT_PROGRAMS[program], "data/in.txt": "abc\n"}
        what = f"{name}.run({program!r} program)"
        result = await acall(
            "sandbox/raised",
            what,
            lambda: box.run([python, "main.py"], files=files, stdin=stdin, timeout=timeout),
        )
        return _expect_result(result, what)

    echo = await run("echo", stdin="def\n")
    if (echo.status, echo.exit_code, echo.stdout, echo.ok) != ("ok", 0, "abcdef\n", True):
        raise ConformanceError(
            "sandbox/ok-run",
            f"{name}: a program printing a file and stdin gave status {echo.status!r}, exit code "
            f"{echo.exit_code}, stdout {echo.stdout!r} (want 'ok', 0, 'abcdef\\n'); reason: {echo.reason!r}",
        )
    exited = await run("exit")
    if (exited.status, exited.exit_code, exited.ok) != ("error", 3, False):
        raise ConformanceError(
            "sandbox/exit-code",
            f"{name}: a program exiting with 3 gave status {exited.status!r}, exit code {exited.exit_code} "
            "(want 'error', 3)",
        )
    await run("leave")
    looked = await run("look")
    if looked.stdout.strip() != "fresh":
        raise ConformanceError(
            "sandbox/fresh", f"{name}: a file written by one run was visible to the next ({looked.stdout!r})"
        )
    start = time.monotonic()
    slept = await run("sleep", timeout=1.0)
    if slept.status != "timeout" or time.monotonic() - start > 20:
        raise ConformanceError(
            "sandbox/timeout",
            f"{name}: a 30 s sleep with timeout=1 gave status {slept.status!r} after "
            f"{time.monotonic() - start:.1f} s (want 'timeout', well before 20 s)",
        )


def check_sandbox(sandbox: object, /, *, python: str = "python3") -> None:
    """Synchronous :func:`acheck_sandbox` (not inside a running event loop).

    Example::

        check_sandbox(LocalSandbox())
    """
    run_sync(acheck_sandbox(sandbox, python=python), "check_sandbox")
