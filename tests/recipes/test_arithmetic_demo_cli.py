"""``tempering rl dataset:arithmetic-demo``: the demo's RL stage on its own, from a ``save_state``
checkpoint given by ``--model.init-state``, without writing Python (subprocess, tiny budget)."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tempering.backend import ModelConfig
from tempering.envs.arithmetic import ArithmeticProblems
from tempering.local import ServiceClient


async def _save_state(service: ServiceClient) -> str:
    client = await ModelConfig(base_model="tempering/tiny", lora_rank=0).create_training_client(service)
    return (await client.save_state("start")).path


def test_arithmetic_problems_builder() -> None:
    builder = ArithmeticProblems(batch_size=3, group_size=2, n_test=10, test_group_size=2)
    assert pickle.loads(pickle.dumps(builder)) == builder
    train, test = asyncio.run(builder())
    assert test is not None
    assert len(train.get_batch(0)) == 3
    (held_out,) = [test.get_batch(i) for i in range(len(test))]
    assert len(held_out) == 10  # the whole held-out split of split_problems(seed=0, n_test=10)
    with pytest.raises(ValueError, match=r"ArithmeticProblems\.batch_size must be >= 1"):
        ArithmeticProblems(batch_size=0)


@pytest.mark.timeout(600)
def test_rl_alone_from_a_checkpoint(tmp_path: Path, local_root: Path, service: ServiceClient) -> None:
    state = asyncio.run(_save_state(service))
    env = {**os.environ, "TEMPERING_HOME": str(local_root), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    log_dir = tmp_path / "rl"
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "rl", "dataset:arithmetic-demo", "--dataset.n-test", "8",
         "--dataset.batch-size", "2", "--dataset.group-size", "2", "--dataset.test-group-size", "1",
         "--num-steps", "2", "--max-tokens", "8", "--model.init-state", state,
         "--run.log-dir", str(log_dir), "--run.no-progress"],
        capture_output=True, text=True, timeout=540, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    config = json.loads((log_dir / "config.json").read_text())
    assert config["dataset"]["__type__"] == "tempering.envs.arithmetic.ArithmeticProblems"
    assert config["dataset"]["n_test"] == 8
    assert config["model"]["init_state"] == state
    lines = [json.loads(x) for x in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1]
    assert all("env/arithmetic/reward/mean" in x for x in lines)
    assert "test/correct" in lines[-1]  # the held-out split, evaluated after the last step
