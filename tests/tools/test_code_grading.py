"""Code grading in the local sandbox: pass fractions, broken programs, and faked reports."""

from __future__ import annotations

import asyncio

import pytest

from tempering.tools.sandbox import CodeGrade, LocalSandbox, extract_program, grade_program

SANDBOX = LocalSandbox(wall_seconds=10, cpu_seconds=3)
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def _grade(program: str, tests: list[str] = ADD_TESTS, **kwargs: float) -> CodeGrade:
    return asyncio.run(grade_program(SANDBOX, program, tests, **kwargs))  # pyright: ignore[reportArgumentType]


def test_extract_program_takes_the_last_python_block() -> None:
    reply = "First try:\n```python\nx = 1\n```\nBetter:\n```py\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_program(reply) == "def add(a, b):\n    return a + b\n"
    assert extract_program("```\nprint(1)\n```") == "print(1)\n"
    assert extract_program("```bash\nls\n```") is None
    assert extract_program("def add(a, b): return a + b") is None


@pytest.mark.timeout(60)
def test_pass_fraction_and_all_pass() -> None:
    right = _grade("def add(a, b):\n    return a + b\n")
    assert (right.passed, right.total, right.fraction, right.all_passed) == (3, 3, 1.0, True)
    assert right.status == "ok"
    off_by = _grade("def add(a, b):\n    return a + b if a > 0 else 99\n")
    assert (off_by.passed, off_by.all_passed) == (2, False)
    assert off_by.fraction == pytest.approx(2 / 3)


@pytest.mark.timeout(60)
def test_broken_programs_score_zero_with_a_reason() -> None:
    syntax = _grade("def add(a, b) return a + b")
    assert syntax.passed == 0
    exits = _grade("import os\nos._exit(0)\n")
    assert exits.passed == 0
    assert exits.status == "error"
    assert "before every test reported" in exits.reason


@pytest.mark.timeout(60)
def test_a_hanging_test_keeps_the_earlier_passes() -> None:
    graded = _grade("def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n", timeout=3)
    assert graded.passed == 2
    assert graded.status in ("timeout", "cpu_limit")


@pytest.mark.timeout(60)
def test_printing_fake_reports_does_not_pass() -> None:
    fake = "".join(f"print('{'0' * 32} {i} 1')\n" for i in range(3))
    graded = _grade(fake + "import sys\nprint('x 0 1'); print('\\n0 0 1')\n")
    assert graded.passed == 0
