"""``gspo`` and ``stable_reinforce`` through the RL loop on the tiny model: a short run with
each trains (finite loss, the weights move), and the loop gives ``gspo`` its
``sequence_ratio_mask`` from the trained tokens, dropping datums that have none."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest
import tinker

from tempering.backend import ModelConfig
from tempering.envs.tasks import LowercaseTask
from tempering.local import ServiceClient
from tempering.rl.loss_inputs import loss_datums
from tempering.rl.train import RLConfig, train
from tempering.training import AdamConfig, LRSchedule, RunConfig

PROBE = [5, 17, 99, 3, 42, 8, 61, 7]


def _probe_logprobs(service: ServiceClient, path: str | None) -> np.ndarray:
    if path is None:
        sampler = service.create_sampling_client(base_model="tempering/tiny").result()
    else:
        sampler = service.create_sampling_client(model_path=path).result()
    lps = sampler.compute_logprobs(tinker.ModelInput.from_ints(PROBE)).result()
    return np.array(lps[1:], dtype=np.float64)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("loss", ["gspo", "stable_reinforce"])
def test_short_run_trains(loss: str, service: ServiceClient, tmp_path: Path) -> None:
    config = RLConfig(
        run=RunConfig(log_dir=str(tmp_path / loss), save_every=0, eval_every=0, progress=False),
        dataset=LowercaseTask(batch_size=2, group_size=8),
        model=ModelConfig(lora_rank=8),
        adam=AdamConfig(learning_rate=2e-2, schedule=LRSchedule("constant")),
        num_steps=2,
        max_tokens=8,
        loss_fn=loss,  # type: ignore[arg-type]
    )
    result = asyncio.run(train(config, service=service))
    assert len(result.metrics) == 2
    losses = [float(m["optim/loss_sum"]) for m in result.metrics if "optim/loss_sum" in m]  # type: ignore[arg-type]
    assert losses, result.metrics
    assert all(math.isfinite(v) for v in losses), result.metrics
    before = _probe_logprobs(service, None)
    after = _probe_logprobs(service, result.final.sampler_path)
    assert np.abs(after - before).max() > 1e-4, "the weights did not move"


def _datum(mask: list[float]) -> tinker.Datum:
    n = len(mask)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(list(range(1, n + 1))),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(np.arange(2, n + 2, dtype=np.int64)),
            "logprobs": tinker.TensorData.from_numpy(np.full(n, -1.0, dtype=np.float32)),
            "advantages": tinker.TensorData.from_numpy(np.asarray(mask, dtype=np.float32)),
            "mask": tinker.TensorData.from_numpy(np.asarray(mask, dtype=np.float32)),
        },
    )


def test_gspo_datums_get_the_trained_tokens_as_sequence_ratio_mask() -> None:
    trained, untrained = _datum([0, 0, 1, 1, 0]), _datum([0, 0, 0, 0])
    out = loss_datums([trained, untrained], "gspo")
    assert len(out) == 1
    assert set(out[0].loss_fn_inputs) == {"target_tokens", "logprobs", "advantages", "sequence_ratio_mask"}
    np.testing.assert_array_equal(out[0].loss_fn_inputs["sequence_ratio_mask"].to_numpy(), [0, 0, 1, 1, 0])
    # Other losses: the client-side mask is stripped, nothing else added or dropped.
    ppo = loss_datums([trained, untrained], "ppo")
    assert len(ppo) == 2
    assert all("mask" not in d.loss_fn_inputs for d in ppo)
    assert all("sequence_ratio_mask" not in d.loss_fn_inputs for d in ppo)
