"""Fault catalogue, round 3 (issue 32): one writer per run directory, and filesystem faults named.

Each case runs the real ``tempering`` command in a subprocess on the tiny model (or the lock in
process) and checks the exit code, that the message names the path, the holder or the remedy in
one or two lines with no traceback, and that nothing already written is lost.
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tempering.data import DataError, load_chat
from tempering.fs import LOCK_NAME, DirLock, DirLockedError
from tempering.training import RunDir, RunLockedError


@attrs.define
class _Config:
    x: int = 1


_SFT = ["sft", "--run.no-progress"]


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "TEMPERING_HOME": str(home), "OMP_NUM_THREADS": "1", "TEMPERING_DEBUG": ""}


def _tempering(
    args: list[str], home: Path, *, env: dict[str, str] | None = None, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """``tempering ARGS`` in a subprocess with ``$TEMPERING_HOME`` = ``home``."""
    return subprocess.run(  # pyright: ignore[reportCallIssue, reportUnknownVariableType]
        [sys.executable, "-m", "tempering.cli", *args],
        env=env if env is not None else _env(home),
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        **kwargs,  # pyright: ignore[reportArgumentType]
    )


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def _no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    assert len([line for line in stderr.splitlines() if line.strip()]) <= 3, stderr[-3000:]


def _hold_lock(directory: Path) -> subprocess.Popen[str]:
    """Another process holding ``directory``'s lock until killed."""
    code = (
        "import sys, time\nfrom tempering.fs import DirLock\n"
        f"lock = DirLock.acquire({str(directory)!r}, what='run directory')\n"
        "print('locked', flush=True)\ntime.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    directory = tmp_path / "held"
    proc = _hold_lock(directory)
    yield directory, proc
    _stop(proc)


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# ------------------------------------------------------------------------- one writer per directory


@pytest.mark.timeout(300)
def test_two_trainers_on_one_run_dir_the_second_is_refused(tmp_path: Path, tempering_home: Path) -> None:
    """Two runs started 0.5 s apart on one --run.log-dir (the issue's case). Before: both exited
    0; metrics.jsonl had 48 lines for 30 steps and the index two run ids. Now the one that opens
    the directory second is refused, naming the first; the first's files are its own."""
    log_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "tempering.cli",
        *_SFT,
        f"--run.log-dir={log_dir}",
        "--max-steps=25",
        "--run.save-every=10",
    ]
    procs: list[subprocess.Popen[str]] = []
    for _ in range(2):
        procs.append(
            subprocess.Popen(
                cmd, env=_env(tempering_home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
        time.sleep(0.5)
    results = [(p, *p.communicate(timeout=280)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [err[-2000:] for _, _, err in results]
    (winner, out, _), (_, _, refusal) = sorted(results, key=lambda r: r[0].returncode)
    _no_traceback(refusal)
    assert f"run directory {log_dir} is in use by pid {winner.pid} on host" in refusal
    assert "started 20" in refusal  # the holder's start time
    steps = [json.loads(line)["step"] for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(25))  # the arithmetic chat data: 25 batches
    run_ids = {r.state_path.split("/")[2] for r in RunDir(log_dir).checkpoints()}
    assert len(run_ids) == 1
    assert json.loads(out)["step"] == 24


def test_a_run_dir_held_by_another_process_is_refused_in_process(
    holder: tuple[Path, subprocess.Popen[str]],
) -> None:
    directory, proc = holder
    with pytest.raises(RunLockedError, match=rf"in use by pid {proc.pid} on host .* started "):
        RunDir.open(directory, _Config())
    assert not (directory / "config.json").exists()


def test_a_lock_left_by_a_killed_process_is_taken_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The lock file stays after SIGKILL; the kernel dropped the flock, so the next run takes it."""
    directory = tmp_path / "run"
    proc = _hold_lock(directory)
    _stop(proc)  # SIGKILL
    assert json.loads((directory / LOCK_NAME).read_text())["pid"] == proc.pid
    with caplog.at_level(logging.INFO, logger="tempering.fs"):
        run, resumed = RunDir.open(directory, _Config())
    assert not resumed
    assert run.locked
    assert f"taking over the lock left by pid {proc.pid}" in caplog.text
    assert "no longer running" in caplog.text
    assert json.loads((directory / LOCK_NAME).read_text())["pid"] == os.getpid()
    run.close()


def test_the_lock_is_released_when_the_run_ends(tmp_path: Path) -> None:
    run, _ = RunDir.open(tmp_path / "run", _Config())
    run.close()
    code = f"from tempering.fs import DirLock; DirLock.acquire({str(tmp_path / 'run')!r}); print('ok')"
    out = _python(code)
    assert out.stdout.strip() == "ok", out.stderr


@pytest.mark.timeout(120)
def test_a_recipe_output_in_use_is_refused_before_anything_is_removed(
    holder: tuple[Path, subprocess.Popen[str]], tempering_home: Path
) -> None:
    """Before: a second recipe on the same --out removed the first one's files (shutil.rmtree)."""
    directory, proc = holder
    (directory / "keep.txt").write_text("written by the first run")
    out = _tempering(["recipe", "chat-sft", f"--out={directory}", "--no-progress"], tempering_home)
    assert out.returncode == 2, out.stderr[-3000:]
    _no_traceback(out.stderr)
    assert f"in use by pid {proc.pid}" in out.stderr
    assert (directory / "keep.txt").read_text() == "written by the first run"


@pytest.mark.timeout(120)
def test_checkpoints_prune_is_refused_while_a_trainer_holds_the_run(
    holder: tuple[Path, subprocess.Popen[str]], tempering_home: Path
) -> None:
    directory, proc = holder
    (directory / "checkpoints.jsonl").write_text("")
    (directory / "config.json").write_text("{}")
    out = _tempering(["checkpoints", "prune", str(directory), "--keep-last", "1"], tempering_home)
    assert out.returncode == 2, out.stderr[-3000:]
    _no_traceback(out.stderr)
    assert f"in use by pid {proc.pid}" in out.stderr


def test_dir_lock_is_per_process_and_released_by_the_last_handle(tmp_path: Path) -> None:
    first = DirLock.acquire(tmp_path / "d")
    second = DirLock.acquire(tmp_path / "d")  # the same process may open its own directory again
    first.release()
    code = f"from tempering.fs import DirLock; DirLock.acquire({str(tmp_path / 'd')!r})"
    held = _python(code)
    assert held.returncode != 0
    assert "DirLockedError" in held.stderr
    second.release()
    free = _python(code)
    assert free.returncode == 0, free.stderr
    proc = _hold_lock(tmp_path / "e")  # a lock another process holds: DirLockedError, naming it
    try:
        with pytest.raises(DirLockedError, match=f"in use by pid {proc.pid}"):
            DirLock.acquire(tmp_path / "e")
    finally:
        _stop(proc)


# ------------------------------------------------------------------------------ filesystem faults


def _read_only(directory: Path) -> Iterator[Path]:
    """``directory``, made unwritable even for root (chattr +i; chmod for other users)."""
    directory.mkdir(parents=True)
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(directory)], capture_output=True, check=False).returncode:
            pytest.skip("chattr +i is not available: cannot make a directory read-only for root")
        try:
            yield directory
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=False)
    else:
        directory.chmod(0o555)
        try:
            yield directory
        finally:
            directory.chmod(0o755)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    yield from _read_only(tmp_path / "ro")


@pytest.mark.timeout(120)
def test_a_read_only_run_dir_names_the_path_and_the_remedy(read_only_dir: Path, tempering_home: Path) -> None:
    """Before: a raw PermissionError traceback."""
    out = _tempering([*_SFT, f"--run.log-dir={read_only_dir / 'run'}", "--max-steps=1"], tempering_home)
    assert out.returncode == 2, out.stderr[-3000:]
    _no_traceback(out.stderr)
    assert f"creating the run directory {read_only_dir / 'run'} failed: permission denied" in out.stderr
    assert "make the directory writable, or choose another one" in out.stderr


def _limit_file_size(limit: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.timeout(180)
def test_a_full_disk_names_the_checkpoint_and_keeps_the_metrics(tmp_path: Path, tempering_home: Path) -> None:
    """Writes fail part-way as on a full disk (here a 30 kB file-size limit, RLIMIT_FSIZE: a
    real EFBIG from the kernel). Before: ``SafetensorError: Error while serializing: I/O error``
    with no path, as a traceback."""
    log_dir = tmp_path / "run"
    out = _tempering(
        [*_SFT, f"--run.log-dir={log_dir}", "--max-steps=4", "--run.save-every=2"],
        tempering_home,
        preexec_fn=lambda: _limit_file_size(30_000),
    )
    assert out.returncode == 2, out.stderr[-3000:]
    _no_traceback(out.stderr)
    assert "/weights/step-000002 failed: file too large; free space" in out.stderr
    assert "what was written before is kept" in out.stderr
    lines = (log_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1]  # written before the failure, intact
    assert json.loads((log_dir / "config.json").read_text())["max_steps"] == 4


@pytest.mark.timeout(120)
def test_a_file_where_a_directory_is_expected_is_named(tmp_path: Path, tempering_home: Path) -> None:
    """$TEMPERING_HOME (the checkpoint store) given as a file. Before: ``FileExistsError`` traceback."""
    blocker = tmp_path / "home-file"
    blocker.write_text("not a directory")
    out = _tempering(
        [*_SFT, f"--run.log-dir={tmp_path / 'run'}", "--max-steps=1"],
        tempering_home,
        env={**_env(tempering_home), "TEMPERING_HOME": str(blocker)},
    )
    assert out.returncode == 2, out.stderr[-3000:]
    _no_traceback(out.stderr)
    assert f"{blocker} is a regular file where a directory is expected" in out.stderr
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink loop"])
def test_a_data_path_that_is_not_a_file_is_named_as_what_it_is(tmp_path: Path, kind: str) -> None:
    """Before: a FIFO, a directory and a symlink loop were each reported as "no such file"."""
    path = tmp_path / "data.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "other.jsonl")
        (tmp_path / "other.jsonl").symlink_to(path)
    expected = {"fifo": "a FIFO (named pipe)", "directory": "a directory", "symlink loop": "a symlink loop"}[
        kind
    ]
    with pytest.raises(DataError, match=re.escape(f"data.jsonl: is {expected}, not a regular file")):
        load_chat(path)


@pytest.mark.timeout(60)
def test_a_data_row_nested_100k_levels_is_a_named_error(tmp_path: Path) -> None:
    """Before: ``RecursionError`` with no file or line."""
    path = tmp_path / "deep.jsonl"
    good = {"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]}
    path.write_text(json.dumps(good) + "\n" + '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(
        DataError, match=r"deep\.jsonl:2: JSON nested deeper than 64 levels .* at character 77"
    ):
        load_chat(path)
