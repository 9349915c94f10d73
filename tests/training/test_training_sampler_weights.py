"""``RunConfig.save_sampler_weights`` on a trainer whose default is off (SFT): periodic
checkpoints record no ``sampler_path`` unless it is turned on; the final checkpoint always has one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import tinker

from tempering.local import ServiceClient
from tempering.sft import ChatData, SFTConfig
from tempering.training import RunConfig, RunDir


@pytest.mark.parametrize("flag", [None, True])
def test_sft_periodic_sampler_weights_follow_the_flag(
    service: ServiceClient, tmp_path: Path, flag: bool | None
) -> None:
    config = SFTConfig(
        run=RunConfig(
            log_dir=str(tmp_path / "run"),
            save_every=2,
            eval_every=0,
            progress=False,
            save_sampler_weights=flag,
        ),
        data=ChatData(batch_size=4, test_path=None, test_size=8),
        max_steps=3,
    )
    asyncio.run(config(service))
    index = RunDir(tmp_path / "run").checkpoints()
    assert [(r.step, r.final) for r in index] == [(2, False), (3, True)]
    assert (index[0].sampler_path is not None) == bool(flag)
    assert index[1].sampler_path is not None
    if flag:
        sampler = service.create_sampling_client(model_path=index[0].sampler_path).result()
        assert len(sampler.compute_logprobs(tinker.ModelInput.from_ints([1, 2, 3])).result()) == 3
