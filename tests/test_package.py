"""Packaging invariants: what imports what, and the CLI entry point."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_protocols_import_without_tempering_or_torch() -> None:
    loaded = _run(
        "import sys, tempering_protocols, tempering_protocols.testing; "
        "print(','.join(m for m in ('tempering', 'torch', 'transformers.modeling_utils') if m in sys.modules))"
    )
    assert loaded == ""


def test_tempering_imports_without_torch() -> None:
    loaded = _run("import sys, tempering; print('torch' in sys.modules)")
    assert loaded == "False"


def test_core_extension_is_the_compiled_module() -> None:
    import tempering._core as core

    assert core.__file__ is not None
    assert core.__file__.endswith((".so", ".pyd"))
    assert issubclass(core.DataError, ValueError)
    assert core.DataError.__module__ == "tempering._core"


@pytest.mark.parametrize("argv", [["demo"]])
def test_cli_commands_exit_zero(argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", *argv], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
