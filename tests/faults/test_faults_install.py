"""Issue 16: without the ``local`` extra (no torch), a command that needs the local engine says
in one line which extra to install, or that ``TINKER_API_KEY`` selects the hosted service; no
traceback. Issue 31: a bare install (neither ``local`` nor ``view``) names every extra the
command needs in that one line (``pip install 'tempering[local,view]'``). A module's absence is
simulated by a ``sitecustomize`` import hook in a subprocess (``HIDE``: the modules it hides)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HOOK = """
import os, sys

HIDE = os.environ["HIDE"].split(",")

class _Hidden:
    def find_spec(self, name, path=None, target=None):
        if any(name == m or name.startswith(m + ".") for m in HIDE):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Hidden())
"""

BARE = "torch,transformers,peft,safetensors,tokenizers,gguf,plotly,starlette,uvicorn"
"""What a bare ``pip install tempering`` lacks: the ``local`` and the ``view`` extras' modules."""


def _run(tmp_path: Path, *args: str, hide: str = "torch") -> subprocess.CompletedProcess[str]:
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "HIDE": hide}
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


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


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
    line = _one_line(_run(tmp_path, "-m", "tempering.cli", *argv))
    assert line.startswith(
        f"tempering {argv[0]}: needs the `local` extra (the local engine: 'torch' is not installed)"
    )
    assert line.endswith("pip install 'tempering[local]'") or "pip install 'tempering[local]';" in line
    # Only the trainers can use the hosted service instead; the demo and tiny-model cannot.
    assert ("TINKER_API_KEY" in line) == (argv[0] == "sft")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("argv", "hide", "install"),
    [
        (["demo", "--out", "runs/demo"], BARE, "pip install 'tempering[local,view]'"),
        (["demo", "--out", "runs/demo"], "plotly", "pip install 'tempering[view]'"),
        (["view", "runs/x"], BARE, "pip install 'tempering[view]'"),
        (["sft", "--run.log-dir", "runs/sft"], BARE, "pip install 'tempering[local]'"),
    ],
    ids=["demo-bare", "demo-no-plotly", "view-bare", "sft-bare"],
)
def test_a_bare_install_names_every_extra_in_one_line(
    tmp_path: Path, argv: list[str], hide: str, install: str
) -> None:
    line = _one_line(_run(tmp_path, "-m", "tempering.cli", *argv, hide=hide))
    assert line.startswith(f"tempering {argv[0]}: needs the `")
    assert install in line
    assert line.count("pip install") == 1
    if "local" in install:
        assert (
            "the `local` extra (the local engine: 'torch', 'transformers', 'peft', … are not installed)"
            in line
        )
    if "view" in install:
        assert "the `view` extra (the run page: " in line
    assert not (tmp_path / "runs").exists(), "nothing is written before the extras are there"
