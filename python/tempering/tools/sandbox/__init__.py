"""Sandboxed code execution: backends of ``tempering_protocols.Sandbox`` and code grading.

- :class:`LocalSandbox`: a limited, isolated subprocess on this machine (Linux).
- :class:`SandboxFusionSandbox`: a SandboxFusion server's ``/run_code`` over HTTP.
- :func:`grade_program`: run a problem's tests against a generated program; pass fraction.

See docs/sandbox.md.

Example::

    from tempering.tools.sandbox import LocalSandbox, grade_program
    result = await LocalSandbox().run(["python3", "-c", "print(1 + 1)"])
    program = "def add(a, b):\\n    return a + b\\n"
    grade = await grade_program(LocalSandbox(), program, ["assert add(1, 2) == 3"])
"""

from __future__ import annotations

from tempering.tools.sandbox.fusion import SandboxFusionSandbox
from tempering.tools.sandbox.grading import CodeGrade, extract_program, grade_program
from tempering.tools.sandbox.local import ISOLATION_STEPS, LocalSandbox, write_files
from tempering_protocols.sandbox import Sandbox, SandboxResult, SandboxStatus

__all__ = [
    "ISOLATION_STEPS",
    "CodeGrade",
    "LocalSandbox",
    "Sandbox",
    "SandboxFusionSandbox",
    "SandboxResult",
    "SandboxStatus",
    "extract_program",
    "grade_program",
    "write_files",
]
