"""Checkpoints kept in bounds: ``RunConfig.keep_last``, ``tempering checkpoints prune`` on a run
and on the store, ``list``/``show``/``rm``, and ``tempering export`` from a run directory."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from tempering.local import CheckpointStore
from tempering.local.inventory import list_stored, prune_store
from tempering.sft import ChatData, SFTConfig
from tempering.training import TEST_KILL_ENV, RunConfig, RunDir
from tempering.training.retention import prunable
from tempering.training.rundir import CheckpointRecord

STEPS = 8
KILLED_STEPS = 12  # killed after its 10th checkpoint


def _sft(log_dir: Path, *, keep_last: int | None = None, steps: int = STEPS) -> SFTConfig:
    return SFTConfig(
        run=RunConfig(log_dir=str(log_dir), save_every=1, eval_every=0, progress=False, keep_last=keep_last),
        data=ChatData(batch_size=2, test_path=None, test_size=4),
        max_steps=steps,
    )


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "TEMPERING_HOME": str(home), "TEMPERING_NUM_THREADS": "1", **extra}
    env.pop("TINKER_API_KEY", None)
    if TEST_KILL_ENV not in extra:
        env.pop(TEST_KILL_ENV, None)
    return env


def _cli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tempering.cli", *args],
        env=_env(home, **env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``tempering ARGS`` in this process (the caller sets TEMPERING_HOME)."""
    from tempering.cli import main

    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse, and refusals that exit with their message
        code = exc.code if isinstance(exc.code, int) else 2
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    out = capsys.readouterr()
    return code, out.out, out.err


def _record(name: str, step: int, *, final: bool = False) -> CheckpointRecord:
    return CheckpointRecord(name=name, step=step, epoch=0, batch=step, state_path=f"p/{name}", final=final)


def test_prunable_keeps_the_newest_and_every_final() -> None:
    records = [_record(f"step-{i}", i) for i in range(1, 10)] + [_record("final", 10, final=True)]
    assert [r.name for r in prunable(records, 2)] == [f"step-{i}" for i in range(1, 8)]
    assert [r.name for r in prunable(records[:-1], 3)] == [f"step-{i}" for i in range(1, 7)]
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        prunable(records, 0)
    with pytest.raises(ValueError, match=r"--run\.keep-last must be >= 1"):
        RunConfig(log_dir="x", keep_last=0)


@pytest.mark.timeout(300)
def test_keep_last_rolls_periodic_checkpoints(
    tmp_path: Path, tempering_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPERING_HOME", str(tempering_home))
    result = asyncio.run(_sft(tmp_path / "run", keep_last=2)())
    records = RunDir(tmp_path / "run").checkpoints()
    assert [r.name for r in records] == ["step-000006", "step-000007", "final"]
    assert result.final.name == "final"
    store = CheckpointStore(tempering_home)
    for r in records:
        store.load(r.state_path)  # still there
    run_id = records[-1].state_path.split("/")[2]
    left = {c.name for c in list_stored(store, run_id) if c.kind == "weights"}
    assert left == {"step-000006", "step-000007", "final"}


@pytest.mark.timeout(600)
def test_prune_keep_last_2_of_10_then_the_run_still_resumes(
    tmp_path: Path, tempering_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's check: a run killed with 10 periodic checkpoints, pruned to its last 2, resumes
    from the newest and finishes."""
    log_dir = tmp_path / "run"
    args = ["sft", f"--run.log-dir={log_dir}", "--run.save-every=1", "--run.eval-every=0"]
    args += ["--run.no-progress", "--data.batch-size=2", "--data.test-path=None", "--data.test-size=4"]
    args += [f"--max-steps={KILLED_STEPS}"]
    killed = _cli(tempering_home, *args, **{TEST_KILL_ENV: "after_index:9"})
    assert killed.returncode == -9, killed.stderr
    monkeypatch.setenv("TEMPERING_HOME", str(tempering_home))
    run = RunDir(log_dir)
    before = run.checkpoints()
    assert [r.step for r in before] == list(range(1, 11))
    code, out, err = _main(capsys, "checkpoints", "prune", str(log_dir), "--keep-last", "2", "--dry-run")
    assert code == 0, err
    assert "would remove 8" in out
    assert len(run.checkpoints()) == 10
    code, out, err = _main(capsys, "checkpoints", "prune", str(log_dir), "--keep-last", "2")
    assert code == 0, err
    after = run.checkpoints()
    assert [r.name for r in after] == ["step-000009", "step-000010"]
    store = CheckpointStore(tempering_home)
    for r in before[:8]:
        with pytest.raises(FileNotFoundError):
            store.load(r.state_path)
    code, out, err = _main(capsys, *args)
    assert code == 0, err
    steps = [int(m["step"]) for m in run.read_metrics()]
    assert steps == list(range(KILLED_STEPS))
    assert run.checkpoints()[-1].final

    # export straight from the run directory (its final checkpoint), and load it with transformers
    exported_dir = tmp_path / "exported"
    code, out, err = _main(capsys, "export", str(log_dir), str(exported_dir))
    assert code == 0, err
    assert "wrote a Hugging Face model" in out
    model = AutoModelForCausalLM.from_pretrained(exported_dir)
    assert model.config.vocab_size > 0
    assert "max_steps" in (exported_dir / "README.md").read_text()
    code, out, err = _main(capsys, "export", str(log_dir), str(tmp_path / "x"), "--name", "step-000001")
    assert code != 0
    assert "no checkpoint named 'step-000001'" in err
    assert "step-000009" in err


def test_store_prune_never_removes_a_runs_newest(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    now = time.time()
    for run_id in ("run-a", "run-b"):
        for i in range(4):
            d = tmp_path / "checkpoints" / run_id / "weights" / f"step-{i}"
            d.mkdir(parents=True)
            (d / "meta.json").write_text("{}")
            (d / "weights.safetensors").write_bytes(b"x" * 100)
            os.utime(d, (now - 86400 * (10 - i), now - 86400 * (10 - i)))
    listed = list_stored(store)
    assert len(listed) == 8
    assert all(c.meta is None and c.size_bytes == 102 for c in listed)
    # every checkpoint is older than a day, but each run's newest stays
    gone = prune_store(store, older_than_s=86400, now=now)
    assert sorted(c.path for c in gone) == sorted(
        f"tempering://{r}/weights/step-{i}" for r in ("run-a", "run-b") for i in range(3)
    )
    assert sorted(c.path for c in list_stored(store)) == [
        "tempering://run-a/weights/step-3",
        "tempering://run-b/weights/step-3",
    ]
    with pytest.raises(ValueError, match="needs a rule"):
        prune_store(store)


def test_cli_list_show_rm(tmp_path: Path, tempering_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    d = home / "checkpoints" / "run-x" / "weights" / "final"
    d.mkdir(parents=True)
    src = CheckpointStore(tempering_home)
    stored = [c for c in list_stored(src) if c.meta is not None and c.kind == "weights"]
    if not stored:
        pytest.skip("no checkpoint in the shared store yet")
    for f in stored[0].directory.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    code, out, err = _main(capsys, "checkpoints", "list", "--store", str(home))
    assert code == 0, err
    assert "tempering://run-x/weights/final" in out
    assert "1 checkpoints" in out
    code, out, err = _main(
        capsys, "checkpoints", "show", "tempering://run-x/weights/final", "--store", str(home)
    )
    assert code == 0, err
    assert '"base_model"' in out
    assert "weights.safetensors" in out
    code, out, err = _main(
        capsys, "checkpoints", "show", "tempering://run-x/weights/nope", "--store", str(home)
    )
    assert code == 2
    assert "no checkpoint at" in err
    code, out, err = _main(
        capsys, "checkpoints", "rm", "tempering://run-x/weights/final", "--store", str(home)
    )
    assert code == 0, err
    assert not (home / "checkpoints" / "run-x").exists()
