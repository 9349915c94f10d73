"""Truncated (TIS) and masked (MIS) importance-sampling correction, the off-policy sequence mask,
the diagnostics, bad options refused, and a tiny RL run with the correction on."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pytest

from tempering.envs.tasks import LowercaseTask
from tempering.local import ServiceClient
from tempering.rl.importance import ImportanceCorrection, importance_weights
from tempering.rl.train import RLConfig, train
from tempering.training import AdamConfig, LRSchedule, RunConfig

# Two datums: positions [0, 3) and [3, 6); position 0 and 3 are observations (mask 0).
MASK = np.array([0, 1, 1, 0, 1, 1], dtype=np.float32)
OFFSETS = np.array([0, 3, 6], dtype=np.int64)
SAMPLER = np.array([0, -1.0, -1.0, 0, -2.0, -2.0], dtype=np.float32)
# rho = exp(trainer - sampler): 1, e^1.5 (4.48), | e^-0.1 (0.90), e^0.1 (1.11)
TRAINER = np.array([5, -1.0, 0.5, 7, -2.1, -1.9], dtype=np.float32)


def test_tis_truncates_the_ratio_at_the_cap() -> None:
    w, mask, m = importance_weights(TRAINER, SAMPLER, MASK, OFFSETS, ImportanceCorrection("tis", cap=2.0))
    expected = [0.0, 1.0, 2.0, 0.0, math.exp(-0.1), math.exp(0.1)]
    np.testing.assert_allclose(w, expected, rtol=1e-5)
    assert mask.tolist() == MASK.tolist()
    assert m["is/frac_truncated"] == pytest.approx(0.25)
    assert m["is/ratio_max"] == pytest.approx(math.exp(1.5), rel=1e-5)
    assert m["is/frac_masked_sequences"] == 0.0


def test_mis_zeroes_the_tokens_above_the_cap() -> None:
    w, _, _ = importance_weights(TRAINER, SAMPLER, MASK, OFFSETS, ImportanceCorrection("mis", cap=2.0))
    np.testing.assert_allclose(w, [0.0, 1.0, 0.0, 0.0, math.exp(-0.1), math.exp(0.1)], rtol=1e-5)


def test_the_sequence_mask_drops_an_off_policy_datum_whole() -> None:
    # Datum 0's mean log-ratio is 0.75 > log(2) = 0.69: masked; datum 1's is 0.
    correction = ImportanceCorrection("tis", cap=10.0, sequence_mask=2.0)
    w, mask, m = importance_weights(TRAINER, SAMPLER, MASK, OFFSETS, correction)
    assert mask.tolist() == [0, 0, 0, 0, 1, 1]
    assert w[:3].tolist() == [0.0, 0.0, 0.0]
    assert m["is/frac_masked_sequences"] == 0.5


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"mode": "clip"}, "mode must be"),
        ({"cap": 0.5}, "cap must be"),
        ({"sequence_mask": 1.0}, "sequence_mask"),
    ],
)
def test_bad_options_are_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ImportanceCorrection(**kw)  # pyright: ignore[reportArgumentType]


@pytest.mark.timeout(300)
def test_a_tiny_run_with_tis_logs_the_diagnostics(service: ServiceClient, tmp_path: Path) -> None:
    config = RLConfig(
        run=RunConfig(log_dir=str(tmp_path), save_every=0, eval_every=0, progress=False),
        dataset=LowercaseTask(batch_size=2, group_size=4),
        adam=AdamConfig(learning_rate=1e-3, schedule=LRSchedule("constant")),
        num_steps=2,
        max_tokens=6,
        importance=ImportanceCorrection("tis", cap=2.0, sequence_mask=8.0),
    )
    metrics = asyncio.run(train(config, service=service)).metrics
    trained = [m for m in metrics if "is/ratio_mean" in m]
    assert trained, "no step trained (every group constant?)"
    for m in trained:
        # Sampler and trainer share weights on the local engine: the ratios are close to 1.
        assert m["is/ratio_mean"] == pytest.approx(1.0, abs=0.05)
        assert 0.0 <= m["is/frac_truncated"] <= 1.0


@pytest.mark.timeout(300)
def test_with_tis_the_kl_diagnostic_still_compares_sampler_and_trainer(
    service: ServiceClient, tmp_path: Path
) -> None:
    # async with 2 substeps: a step's second minibatch was sampled before the first one's update,
    # so the trainer's logprobs differ from the sampler's. The correction replaces the loss's
    # logprobs with the trainer's; kl/sample_train_* must still compare the sampler's with them
    # (before the fix they compared the trainer with itself and read 0).
    config = RLConfig(
        run=RunConfig(log_dir=str(tmp_path), save_every=0, eval_every=0, progress=False),
        dataset=LowercaseTask(batch_size=4, group_size=4),
        adam=AdamConfig(learning_rate=2e-2, schedule=LRSchedule("constant")),
        num_steps=3,
        max_tokens=6,
        schedule="async",
        num_substeps=2,
        importance=ImportanceCorrection("tis", cap=2.0),
    )
    metrics = asyncio.run(train(config, service=service)).metrics
    moved = [m for m in metrics if float(m.get("is/ratio_max", 1.0)) > 1.01]
    assert moved, f"no step trained on tokens whose ratio moved: {metrics}"
    for m in moved:
        assert float(m["kl/sample_train_v2"]) > 1e-7, m
        # Jensen: log E[rho] >= E[log rho] = -kl_v1 (same tokens, means over the substeps).
        assert math.log(float(m["is/ratio_mean"])) >= -float(m["kl/sample_train_v1"]) - 1e-6, m
