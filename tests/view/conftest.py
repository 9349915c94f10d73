"""A real tiny RL run with trajectory logs, shared by the viewer's tests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tempering.backend import ModelConfig
from tempering.envs.tasks import ArithmeticTask
from tempering.local import ServiceClient
from tempering.rl.train import RLConfig, train
from tempering.training import AdamConfig, LRSchedule, RunConfig


@pytest.fixture(scope="session")
def rl_dir(service: ServiceClient, tmp_path_factory: pytest.TempPathFactory) -> Path:
    log_dir = tmp_path_factory.mktemp("rl")
    config = RLConfig(
        run=RunConfig(log_dir=str(log_dir), save_every=0, eval_every=0, progress=False),
        dataset=ArithmeticTask(),
        model=ModelConfig(lora_rank=4),
        adam=AdamConfig(learning_rate=1e-2, schedule=LRSchedule("constant")),
        num_steps=2,
        max_tokens=6,
        log_trajectories=True,
    )
    asyncio.run(train(config, service=service))
    return log_dir
