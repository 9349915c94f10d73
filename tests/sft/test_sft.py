"""SFT on the shipped chat data lowers held-out NLL on the tiny model; configs pickle and parse."""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path

import pytest
import tyro

from tempering.local import ServiceClient
from tempering.sft import ChatData, SFTConfig
from tempering.training import AdamConfig, LRSchedule, RunConfig, RunDir


def test_sft_lowers_held_out_nll(tmp_path: Path, service: ServiceClient) -> None:
    config = SFTConfig(
        run=RunConfig(log_dir=str(tmp_path / "run"), save_every=5, eval_every=5, progress=False),
        data=ChatData(batch_size=8),
        adam=AdamConfig(
            learning_rate=2e-3, grad_clip_norm=100.0, schedule=LRSchedule("cosine", warmup_steps=2)
        ),
        max_steps=12,
    )
    result = asyncio.run(config(service))
    metrics = result.metrics
    assert [m["step"] for m in metrics] == list(range(12))
    before, after = metrics[0]["initial/test/nll"], metrics[-1]["test/nll"]
    assert after < 0.7 * before, (before, after)
    assert "test/nll" in metrics[4]
    assert "test/nll" not in metrics[5]
    for m in metrics:
        assert {"epoch", "progress", "loss", "lr", "tokens", "time/step", "optim/grad_norm"} <= set(m)
    assert metrics[0]["lr"] == pytest.approx(2e-3 / 3)  # warmup
    run = RunDir(tmp_path / "run")
    assert [r.step for r in run.checkpoints()] == [5, 10, 12]
    assert run.checkpoints()[-1].final
    assert result.final.sampler_path is not None


def test_config_pickles_and_builds_from_flags() -> None:
    config = tyro.cli(
        SFTConfig,
        args=[
            "--run.log-dir=runs/x",
            "--adam.schedule.kind=cosine",
            "--adam.weight-decay=0.01",
            "--data.batch-size=4",
            "--max-steps=3",
        ],
    )
    assert config.adam.schedule.kind == "cosine"
    assert config.adam.weight_decay == 0.01
    assert config.data.batch_size == 4
    assert pickle.loads(pickle.dumps(config)) == config
    train, test = config.data(config.model)()
    assert test is not None
    assert len(train) == 400 // 4
    assert len(train.get_batch(0)) == 4
