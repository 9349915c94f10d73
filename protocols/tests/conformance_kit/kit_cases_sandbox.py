"""A correct in-process fake sandbox and deliberately broken ones, one per sandbox rule.

The fake runs nothing: it knows the kit's programs (``KIT_PROGRAMS``) and answers each as a
real sandbox would, so each broken subclass differs from it in exactly one way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tempering_protocols import SandboxResult
from tempering_protocols.testing import KIT_PROGRAMS, check_sandbox


class FakeSandbox:
    """Answers the kit's programs correctly; keeps no state between runs."""

    async def run(
        self,
        command: Sequence[str],
        /,
        *,
        files: Mapping[str, str | bytes] | None = None,
        stdin: str | None = None,
        timeout: float | None = None,
    ) -> SandboxResult:
        del command
        program = {v: k for k, v in KIT_PROGRAMS.items()}[str((files or {})["main.py"])]
        return self.answer(program, files or {}, stdin, timeout)

    def answer(
        self, program: str, files: Mapping[str, str | bytes], stdin: str | None, timeout: float | None
    ) -> SandboxResult:
        if program == "echo":
            out = str(files["data/in.txt"]).strip() + (stdin or "").strip() + "\n"
            return SandboxResult("ok", 0, out, "", 0.01)
        if program == "exit":
            return SandboxResult("error", 3, "", "", 0.01, "exited with code 3")
        if program == "look":
            return SandboxResult("ok", 0, "fresh\n", "", 0.01)
        if program == "sleep":
            return SandboxResult("timeout", None, "", "", timeout or 0.0, "wall time")
        return SandboxResult("ok", 0, "", "", 0.01)


class ReturnsDict(FakeSandbox):
    def answer(
        self, program: str, files: Mapping[str, str | bytes], stdin: str | None, timeout: float | None
    ) -> SandboxResult:
        return {"status": "ok"}  # type: ignore[return-value]  # pyright: ignore[reportReturnType]


class NegativeTime(FakeSandbox):
    def answer(
        self, program: str, files: Mapping[str, str | bytes], stdin: str | None, timeout: float | None
    ) -> SandboxResult:
        result = super().answer(program, files, stdin, timeout)
        return SandboxResult(result.status, result.exit_code, result.stdout, result.stderr, -1.0)


class IgnoresStdin(FakeSandbox):
    def answer(
        self, program: str, files: Mapping[str, str | bytes], stdin: str | None, timeout: float | None
    ) -> SandboxResult:
        return super().answer(program, files, None, timeout)


class ExitIsOk(FakeSandbox):
    def answer(
        self, program: str, files: Mapping[str, str | bytes], stdin: str | None, timeout: float | None
    ) -> SandboxResult:
        if program == "exit":
            return SandboxResult("ok", 3, "", "", 0.01)
        return super().answer(program, files, stdin, timeout)


class KeepsFiles(FakeSandbox):
    def answer(
        self, program: str, files: Mapping[str, str | bytes], stdin: str | None, timeout: float | None
    ) -> SandboxResult:
        if program == "look":
            return SandboxResult("ok", 0, "stale\n", "", 0.01)
        return super().answer(program, files, stdin, timeout)


class TimeoutAsError(FakeSandbox):
    def answer(
        self, program: str, files: Mapping[str, str | bytes], stdin: str | None, timeout: float | None
    ) -> SandboxResult:
        if program == "sleep":
            return SandboxResult("error", None, "", "", 1.0, "killed")
        return super().answer(program, files, stdin, timeout)


class RaisesOnTimeout(FakeSandbox):
    def answer(
        self, program: str, files: Mapping[str, str | bytes], stdin: str | None, timeout: float | None
    ) -> SandboxResult:
        if program == "sleep":
            raise TimeoutError("the code ran too long")
        return super().answer(program, files, stdin, timeout)


class SyncRun:
    def run(self, command: Sequence[str], /, **kwargs: object) -> SandboxResult:
        del command, kwargs
        return SandboxResult("ok", 0, "", "", 0.0)


CASES: list[tuple[str, Callable[[], object], Callable[[object], object]]] = [
    # (rule, makes the broken object, the check that must fail with the rule)
    ("protocol/async", SyncRun, check_sandbox),
    ("sandbox/return-type", ReturnsDict, check_sandbox),
    ("sandbox/return-type", NegativeTime, check_sandbox),
    ("sandbox/ok-run", IgnoresStdin, check_sandbox),
    ("sandbox/exit-code", ExitIsOk, check_sandbox),
    ("sandbox/fresh", KeepsFiles, check_sandbox),
    ("sandbox/timeout", TimeoutAsError, check_sandbox),
    ("sandbox/raised", RaisesOnTimeout, check_sandbox),
]
