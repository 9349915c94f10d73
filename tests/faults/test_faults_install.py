"""Issue 16: without the ``local`` extra (no torch), a command that needs the local engine says
in one line which extra to install, or that ``TINKER_API_KEY`` selects the hosted service; no
traceback. torch's absence is simulated by a ``sitecustomize`` import hook in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HOOK = """
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook_dir), env.get("PYTHONPATH")) if p)
    env.pop("TINKER_API_KEY", None)
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=150, cwd=tmp_path
    )


@pytest.mark.timeout(160)
def test_the_simulation_hides_torch(tmp_path: Path) -> None:
    proc = _run(tmp_path, "-c", "import torch")
    assert proc.returncode == 1
    assert "ModuleNotFoundError: No module named 'torch'" in proc.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "argv",
    [
        ["sft", "--run.log-dir", "runs/sft", "--max-steps", "1"],
        ["demo", "--out", "runs/demo"],
        ["tiny-model", "models/tiny"],
    ],
    ids=["sft", "demo", "tiny-model"],
)
def test_without_torch_a_command_names_the_extra_in_one_line(tmp_path: Path, argv: list[str]) -> None:
    proc = _run(tmp_path, "-m", "tempering.cli", *argv)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith(f"tempering {argv[0]}: the local engine needs the `local` extra ('torch'")
    assert "pip install 'tempering[local]'" in lines[0]
    assert "TINKER_API_KEY" in lines[0]
    assert "Traceback" not in proc.stderr
