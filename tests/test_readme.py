"""The README's Python examples run as written (``make check-wheels`` runs them again against
the built wheels in a fresh virtualenv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(120)
def test_readme_python_examples_run() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "readme_examples.py"), str(ROOT / "README.md")],
        capture_output=True,
        text=True,
        cwd=ROOT / "tests",
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "README examples ok" in out.stdout


def test_a_failing_block_is_named(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("x\n```python\nx = 1\n```\ntext\n```python\nassert x == 2, 'x is not 2'\n```\n")
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "readme_examples.py"), str(readme)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode != 0
    assert "python block 2 failed: AssertionError: x is not 2" in out.stderr
