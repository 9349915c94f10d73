"""Checkpoints outlive the server: paths handed out before a restart resolve after it, and the
server stops cleanly on SIGTERM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tinker

from tempering.serve.testing import API_KEY, ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # the SDK's leak (conftest)


def test_restart_between_save_and_load(serve_root: Path, tiny_dir: Path) -> None:
    data_dir, home = serve_root / "restart-data", serve_root / "restart-home"
    tokens = list(b"restart me, then load me again")
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    prompt = tinker.ModelInput.from_ints(tokens[:4])
    params = tinker.SamplingParams(max_tokens=6, temperature=1.0, seed=3)

    first = ServerProcess(data_dir, home).start()
    try:
        service = tinker.ServiceClient(base_url=first.url, api_key=API_KEY)
        trainer = service.create_lora_training_client(str(tiny_dir), rank=2).result(timeout=120)
        trainer.forward_backward([datum], "cross_entropy")
        trainer.optim_step(tinker.AdamParams(learning_rate=5e-2)).result(timeout=60)
        state = trainer.save_state("before-restart").result(timeout=60).path
        weights = trainer.save_weights_for_sampler("before-restart").result(timeout=60).path
        expected = trainer.forward([datum], "cross_entropy").result(timeout=60)
        sampled = service.create_sampling_client(model_path=weights).result(timeout=60)
        tokens_before = sampled.sample(prompt, 2, params).result(timeout=60)
        service.close("success").result(timeout=30)
    finally:
        assert first.stop() == 0  # SIGTERM: a clean exit

    second = ServerProcess(data_dir, home).start()
    try:
        service = tinker.ServiceClient(base_url=second.url, api_key=API_KEY)
        resumed = service.create_training_client_from_state_with_optimizer(state).result(timeout=120)
        got = resumed.forward([datum], "cross_entropy").result(timeout=60)
        np.testing.assert_allclose(got.metrics["loss:sum"], expected.metrics["loss:sum"], rtol=1e-5)
        sampler = service.create_sampling_client(model_path=weights).result(timeout=60)
        tokens_after = sampler.sample(prompt, 2, params).result(timeout=60)
        assert [s.tokens for s in tokens_after.sequences] == [s.tokens for s in tokens_before.sequences]
        service.close("success").result(timeout=30)
    finally:
        assert second.stop() == 0
