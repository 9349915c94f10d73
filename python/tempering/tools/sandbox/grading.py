"""Code grading: run a problem's tests against a generated program in a sandbox.

A problem's tests are Python statements (``"assert add(1, 2) == 3"``). :func:`grade_program`
writes the program and a small harness into one sandbox run: the harness reads a random nonce
from stdin, ``exec``s the program, then each test in a copy of the program's namespace, and
reports each outcome on stdout as a line starting with the nonce, as soon as it is known (so a
later test that hangs keeps the earlier passes). A ``MemoryError`` is not caught, so the
sandbox reports its memory limit. The program cannot fake a report without the
nonce; it runs in the same interpreter as the harness, so this is a guard against accidents and
naive reward hacks, not against a program written to inspect the harness.

:func:`extract_program` takes the program out of a model's reply (its last fenced code block).

Example::

    grade = await grade_program(LocalSandbox(), "def add(a, b):\\n    return a + b\\n",
                                ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"])
    grade.passed, grade.total, grade.fraction   # 2, 2, 1.0
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence

import attrs

from tempering_protocols.sandbox import Sandbox, SandboxStatus

__all__ = ["HARNESS", "CodeGrade", "extract_program", "grade_program"]

HARNESS = """\
import json, os, sys
nonce = sys.stdin.readline().strip()
with open("tests.json", encoding="utf-8") as f:
    tests = json.load(f)
namespace = {"__name__": "solution"}
try:
    with open("solution.py", encoding="utf-8") as f:
        exec(compile(f.read(), "solution.py", "exec"), namespace)
    loaded = True
except MemoryError:
    raise
except BaseException as e:
    loaded = False
    print(f"the program failed to load: {type(e).__name__}: {e}", file=sys.stderr)
for i, test in enumerate(tests):
    ok = False
    if loaded:
        try:
            exec(compile(test, f"test {i}", "exec"), dict(namespace))
            ok = True
        except MemoryError:
            raise
        except BaseException as e:
            print(f"test {i} failed: {test!r}: {type(e).__name__}: {e}", file=sys.stderr)
    sys.stdout.flush()
    os.write(1, f"\\n{nonce} {i} {int(ok)}\\n".encode())
"""
"""The harness run as ``python3 harness.py`` next to ``solution.py`` and ``tests.json``."""

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_program(text: str) -> str | None:
    """The last fenced code block of ``text`` tagged ``python``/``py`` or untagged; None if none.

    Example::

        extract_program("Here:\\n```python\\nprint(1)\\n```")   # "print(1)\\n"
    """
    found: str | None = None
    for match in _FENCE.finditer(text):
        if match.group(1).lower() in ("", "python", "py", "python3"):
            found = match.group(2)
    return found


@attrs.frozen
class CodeGrade:
    """How a program did on a problem's tests: ``passed`` of ``total``, and the sandbox's
    ``status`` and ``reason`` for the run (``"ok"``/``""`` when it finished cleanly)."""

    passed: int
    total: int
    status: SandboxStatus
    reason: str = ""

    @property
    def fraction(self) -> float:
        """Passed tests over all tests (0 for a problem without tests)."""
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total


async def grade_program(
    sandbox: Sandbox,
    program: str,
    tests: Sequence[str],
    *,
    python: str = "python3",
    timeout: float | None = None,
) -> CodeGrade:
    """Run ``tests`` against ``program`` in one ``sandbox`` run (see the module doc).

    A run that a limit stopped still counts the tests reported before it was stopped.
    """
    if not tests:
        raise ValueError("grade_program: the problem has no tests; give at least one assert statement")
    nonce = secrets.token_hex(16)
    result = await sandbox.run(
        [python, "harness.py"],
        files={"harness.py": HARNESS, "solution.py": program, "tests.json": json.dumps(list(tests))},
        stdin=nonce + "\n",
        timeout=timeout,
    )
    outcomes: dict[int, bool] = {}
    for line in result.stdout.splitlines():
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and parts[2] in ("0", "1"):
            outcomes[int(parts[1])] = parts[2] == "1"
    passed = sum(1 for i, ok in outcomes.items() if ok and i < len(tests))
    status: SandboxStatus = result.status
    reason = result.reason
    if status == "ok" and len(outcomes) < len(tests):
        status, reason = "error", "the program stopped the test harness before every test reported"
    return CodeGrade(passed, len(tests), status, reason)
