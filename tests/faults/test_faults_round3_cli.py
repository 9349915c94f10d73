"""Fault catalogue, round 3 (issue 32): the CLI's error boundary and flag checks.

Every error a user can cause ends in one or two lines (what, where, what to do), exit code 2
for bad input and 130 for Ctrl-C; a traceback only with ``--debug`` or ``TEMPERING_DEBUG=1``,
and for an unexpected error, with a line saying so. Flags are checked before anything is
written: negative counts refused (never bent to 0), NaN refused, a flag given twice or both
ways refused, a path that is the wrong kind of thing named as what it is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tempering.cli import main
from tempering.recipes import RECIPES


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``tempering ARGV`` in this process: its exit code and stderr (argparse/tyro exits too)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def _bad_chat(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    good = {"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({"messages": [{"role": "user"}]}) + "\n")
    return path


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch: pytest.MonkeyPatch, tempering_home: Path) -> None:
    monkeypatch.delenv("TEMPERING_DEBUG", raising=False)
    monkeypatch.setenv("TEMPERING_HOME", str(tempering_home))


# ----------------------------------------------------------------------------- the error boundary


def test_a_data_error_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: about 45 lines of traceback before the line that matters, exit 1."""
    data = _bad_chat(tmp_path)
    code, err = _run(["sft", f"--run.log-dir={tmp_path / 'run'}", f"--data.path={data}"], capsys)
    assert code == 2
    assert err.strip() == f"tempering sft: {data}:2: message 0 (user) has no content"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _bad_chat(tmp_path)
    argv = ["sft", f"--run.log-dir={tmp_path / 'run'}", f"--data.path={data}"]
    if how == "flag":
        argv.append("--debug")
    else:
        monkeypatch.setenv("TEMPERING_DEBUG", "1")
    code, err = _run(argv, capsys)
    assert code == 2
    assert "Traceback (most recent call last)" in err
    assert err.rstrip().endswith(f"tempering sft: {data}:2: message 0 (user) has no content")


_RAISING_BUILDER = '''
import attrs


@attrs.define
class Broken:
    """A supervised dataset builder with a bug."""

    size: int = 3

    def __call__(self):
        return len(None)  # TypeError
'''


def test_an_unexpected_error_shows_its_traceback_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_builder.py").write_text(_RAISING_BUILDER)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["sft", f"--run.log-dir={tmp_path / 'run'}", "--dataset-builder", "broken_builder:Broken"]
    code, err = _run(argv, capsys)
    assert code == 1
    assert "Traceback (most recent call last)" in err
    assert 'broken_builder.py", line 12, in __call__' in err
    assert "tempering sft: unexpected TypeError (traceback above): if it ends in your own code" in err


@pytest.mark.timeout(240)
def test_ctrl_c_exits_130_and_says_how_the_run_resumes(tmp_path: Path, tempering_home: Path) -> None:
    """Before: a KeyboardInterrupt traceback, exit 1, nothing said about resuming."""
    log_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "tempering.cli", "sft", f"--run.log-dir={log_dir}", "--run.no-progress"]
    cmd += ["--max-steps=25", "--run.save-every=2"]
    env = {**os.environ, "TEMPERING_HOME": str(tempering_home), "OMP_NUM_THREADS": "1"}
    env.pop("TEMPERING_DEBUG", None)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    index = log_dir / "checkpoints.jsonl"
    deadline = time.monotonic() + 180
    while not (index.exists() and index.read_text().strip()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert "tempering sft: interrupted (Ctrl-C)." in err
    last = [json.loads(line) for line in index.read_text().splitlines()][-1]
    assert f"{log_dir}: kept up to its checkpoint at step {last['step']}; run the same command again" in err
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(25))


# --------------------------------------------------------------------------- flags checked first


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["sft", "--max-steps", "-1"], "--max-steps must be an integer >= 1, got -1"),
        (["sft", "--data.batch-size", "0"], "--data.batch-size must be an integer >= 1, got 0"),
        (["sft", "--run.save-every", "-5"], "--run.save-every must be an integer >= 0, got -5"),
        (["sft", "--model.seed", "-1"], "--model.seed must be an integer >= 0, got -1"),
        (["dpo", "--beta", "-0.1"], "--beta must be > 0, got -0.1"),
        (["rm", "--num-epochs", "-1"], "--num-epochs must be an integer >= 1, got -1"),
        (
            ["rl", "dataset:arithmetic-task", "--num-steps", "-2"],
            "--num-steps must be an integer >= 1, got -2",
        ),
        (
            ["rl", "dataset:arithmetic-task", "--temperature", "nan"],
            "--temperature must be a number, got nan",
        ),
        (["rl", "dataset:arithmetic-task", "--temperature", "-1"], "--temperature must be >= 0, got -1.0"),
        (
            ["rl", "dataset:arithmetic-task", "--dataset.group-size", "0"],
            "--dataset.group-size must be an integer >= 1, got 0",
        ),
        (
            ["rl", "dataset:arithmetic-task", "--rollout.min-group-fraction", "1.5"],
            "min_group_fraction must be in [0, 1], got 1.5",
        ),
        (["sft", "--max-steps", "3", "--max-steps", "5"], "--max-steps is given twice; give it once"),
        (
            ["sft", "--run.progress", "--run.no-progress"],
            "--run.progress and --run.no-progress are both given; they contradict each other, give one",
        ),
        (["recipe", "chat-sft", "--seed", "-3"], "--seed must be an integer >= 0, got -3"),
        (
            ["rl", "dataset:arithmetic-task", "--model.init-state", "/nonexistent/ckpt"],
            "--model.init-state /nonexistent/ckpt is missing, not a checkpoint directory",
        ),
        (["demo", "--seed", "-3"], "--seed must be an integer >= 0, got -3"),
    ],
)
def test_bad_flags_are_refused_before_anything_is_written(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: accepted; negative counts were bent to 0 or failed after the run dir existed."""
    log_dir = tmp_path / "run"
    where = [f"--out={log_dir}"] if argv[0] in ("recipe", "demo") else [f"--run.log-dir={log_dir}"]
    code, err = _run([*argv, *where], capsys)
    assert code == 2, err
    assert says in err
    assert "Traceback" not in err
    assert not log_dir.exists()


def test_a_log_dir_that_is_a_file_or_under_a_file_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("kept")
    code, err = _run(["sft", f"--run.log-dir={blocker}"], capsys)
    assert code == 2
    assert f"--run.log-dir {blocker} is a regular file, not a directory" in err
    code, err = _run(["sft", f"--run.log-dir={blocker / 'run'}"], capsys)
    assert code == 2
    assert f"cannot be made: {blocker} is a regular file where a directory is expected" in err
    assert blocker.read_text() == "kept"


def test_view_of_a_file_names_it_as_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``tempering view FILE`` said ``no such directory``."""
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    code, err = _run(["view", str(tmp_path / "metrics.jsonl")], capsys)
    assert code == 2
    assert f"{tmp_path / 'metrics.jsonl'}: a regular file, not a directory (expected a run directory)" in err


def test_a_model_directory_that_is_not_a_model_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a message about tokenizer libraries (sentencepiece, tiktoken)."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hi")
    argv = ["sft", f"--run.log-dir={tmp_path / 'run'}", f"--model.base-model={tmp_path / 'notes'}"]
    code, err = _run(argv, capsys)
    assert code == 2, err
    assert f"base model {tmp_path / 'notes'} is a directory but not a model: missing config.json" in err
    assert "sentencepiece" not in err
    assert "Traceback" not in err
    code, err = _run(
        ["sft", f"--run.log-dir={tmp_path / 'run'}", f"--model.base-model={tmp_path / 'gone'}"], capsys
    )
    assert code == 2
    assert f"base model {tmp_path / 'gone'}: no such directory" in err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------- every command, bad flags


def _probes() -> list[list[str]]:
    probes = [[cmd, "--no-such-flag"] for cmd in ("sft", "dpo", "rm", "rl", "demo", "eval")]
    probes += [["recipe", name, "--no-such-flag"] for name in RECIPES]
    probes += [["recipe", "no-such-recipe"], ["no-such-command"], ["tiny-model"]]
    probes += [["serve", "--port", "abc"], ["serve", "--max-request-mb", "nan"], ["view"]]
    probes += [["export"], ["checkpoints", "list", "--no-such-flag"], ["models", "pull"]]
    probes += [
        ["models", "pull", "no-such-model"],
        ["checkpoints", "prune", "/nonexistent/run", "--keep-last", "1"],
    ]
    probes += [["eval", "--benchmark", "no-such-benchmark", "--base-model", "tempering/tiny"]]
    probes += [["checkpoints", "list", "/nonexistent/run"], ["models", "list", "--store", "/dev/null"]]
    probes += [["rl", "dataset:arithmetic-task", "--model.init-state", "/nonexistent/ckpt"]]
    return probes


@pytest.mark.parametrize("argv", _probes(), ids=lambda a: " ".join(a))
def test_every_command_refuses_bad_flags_without_a_traceback(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(argv, capsys)
    assert code == 2, err[-2000:]
    assert "Traceback" not in err
    assert err.strip()
