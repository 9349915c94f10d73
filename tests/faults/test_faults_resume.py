"""Crash/resume faults (issue 15, item 12): a missing or truncated last checkpoint is named with
the index line and the previous checkpoint offered; orphan scratch directories of a save killed
midway are cleaned when a service starts."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

from tempering.local import ServiceClient
from tempering.local.checkpoints import CheckpointStore
from tempering.sft import ChatData, SFTConfig
from tempering.training import RunConfig, RunDir
from tempering.training.rundir import RunDirCorruptError


def _config(log_dir: Path) -> SFTConfig:
    return SFTConfig(
        run=RunConfig(log_dir=str(log_dir), save_every=2, eval_every=100, progress=False),
        data=ChatData(batch_size=2),
        max_steps=4,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_broken_last_checkpoint_is_named_and_the_previous_offered(
    damage: str, tmp_path: Path, service: ServiceClient, local_root: Path
) -> None:
    log_dir = tmp_path / "run"
    asyncio.run(_config(log_dir)(service))
    run = RunDir(log_dir)
    records = run.checkpoints()
    assert [r.step for r in records] == [2, 4]
    weights = CheckpointStore(local_root).resolve(records[-1].state_path) / "weights.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        weights.parent.joinpath("meta.json").unlink()
    metrics_before = run.metrics_path.read_bytes()
    with pytest.raises(RunDirCorruptError) as exc:
        asyncio.run(_config(log_dir)(service))
    message = str(exc.value)
    assert message.startswith(f"{run.index_path}:2: checkpoint 'final' (step 4, {records[-1].state_path})")
    assert "cannot be loaded" in message
    assert f"previous checkpoint {records[0].name!r} (step 2), delete line 2 of {run.index_path}" in message
    assert run.metrics_path.read_bytes() == metrics_before  # nothing lost
    # Following the advice resumes from step 2 and trains steps 2 and 3 again.
    run.index_path.write_text(run.index_path.read_text().splitlines()[0] + "\n")
    asyncio.run(_config(log_dir)(service))
    assert [m["step"] for m in run.read_metrics()] == [0, 1, 2, 3]
    assert [(r.step, r.final) for r in run.checkpoints()] == [(2, False), (4, True)]


@pytest.mark.timeout(60)
def test_orphan_scratch_dirs_are_cleaned_when_a_service_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tempering.local.checkpoints")
    weights = tmp_path / "checkpoints" / "run-1" / "weights"
    old = weights / ".step-3-k2j3abcd"
    young = weights / ".step-4-zz9yxw12"
    kept = weights / "step-2"
    for d in (old, young, kept):
        d.mkdir(parents=True)
        (d / "weights.safetensors").write_bytes(b"partial")
    long_ago = time.time() - 3600
    for p in (old / "weights.safetensors", old):
        os.utime(p, (long_ago, long_ago))
    client = ServiceClient(root=tmp_path, device="cpu", dtype="float32", num_threads=1)
    client.close()
    assert not old.exists()
    assert young.exists()  # may be a save in progress in another process
    assert (kept / "weights.safetensors").read_bytes() == b"partial"  # checkpoints untouched
    assert any(
        "removed 1 scratch directory left by interrupted checkpoint saves" in m for m in caplog.messages
    )
