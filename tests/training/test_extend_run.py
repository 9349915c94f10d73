"""Extending a finished run: resuming with only a larger ``max_steps`` continues from its final
checkpoint, step for step as one longer run (constant learning rate); any other change is
refused with the fields that differ."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tempering.sft import ChatData, SFTConfig
from tempering.training import AdamConfig, LRSchedule, RunConfig, RunDir, RunExistsError


def _config(log_dir: Path, steps: int, lr: float = 1e-3) -> SFTConfig:
    return SFTConfig(
        run=RunConfig(log_dir=str(log_dir), save_every=0, eval_every=0, progress=False),
        data=ChatData(batch_size=4, test_path=None, test_size=0),
        adam=AdamConfig(learning_rate=lr, schedule=LRSchedule("constant")),
        max_steps=steps,
    )


@pytest.mark.timeout(600)
def test_a_finished_run_extends_to_more_steps(
    tmp_path: Path, tempering_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPERING_HOME", str(tempering_home))
    asyncio.run(_config(tmp_path / "ext", 3)())
    asyncio.run(_config(tmp_path / "ext", 5)())
    whole = asyncio.run(_config(tmp_path / "whole", 5)())
    lines = RunDir(tmp_path / "ext").read_metrics()
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4]
    assert [m["loss"] for m in lines] == pytest.approx([m["loss"] for m in whole.metrics], rel=1e-5)
    final = RunDir(tmp_path / "ext").checkpoints()[-1]
    assert final.final
    assert final.step == 5
    # the recorded config is the extended one: resuming at 5 steps is a no-op, not a refusal
    asyncio.run(_config(tmp_path / "ext", 5)())
    assert [m["step"] for m in RunDir(tmp_path / "ext").read_metrics()] == [0, 1, 2, 3, 4]
    with pytest.raises(RunExistsError, match=r"fields adam: .*only a larger"):
        asyncio.run(_config(tmp_path / "ext", 7, lr=2e-3)())
    with pytest.raises(RunExistsError, match="max_steps: 5 -> 4"):
        asyncio.run(_config(tmp_path / "ext", 4)())
