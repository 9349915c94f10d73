"""Sampler weights on ``tempering serve``: bounded in memory over an RL-shaped loop, evicted
samplers still answer the same, one snapshot per weights version, inflight clients updated in
place, and a session's end releases its weights (:mod:`tempering.serve.samplers`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker

from tempering.serve.samplers import DECODE_COPIES
from tempering.serve.testing import API_KEY, ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

RESIDENT = 2


@pytest.fixture(scope="module")
def server(serve_root: Path, tiny_dir: Path) -> Iterator[ServerProcess]:
    del tiny_dir
    before = os.environ.get("TEMPERING_SERVE_RESIDENT_SAMPLERS")
    os.environ["TEMPERING_SERVE_RESIDENT_SAMPLERS"] = str(RESIDENT)
    try:
        process = ServerProcess(serve_root / "data", serve_root / "home")
        process.start()
    finally:
        if before is None:
            del os.environ["TEMPERING_SERVE_RESIDENT_SAMPLERS"]
        else:
            os.environ["TEMPERING_SERVE_RESIDENT_SAMPLERS"] = before
    try:
        yield process
    finally:
        process.stop()


def health(server: ServerProcess) -> dict[str, int]:
    response = httpx.get(f"{server.url}/api/v1/healthz", headers={"X-API-Key": API_KEY}, timeout=10)
    return response.json()


def sft_datum(tokens: list[int]) -> tinker.Datum:
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(np.asarray(tokens[1:], dtype=np.int64)),
            "weights": tinker.TensorData.from_numpy(np.ones(len(tokens) - 1, dtype=np.float32)),
        },
    )


TOKENS = list(b"the quick brown fox jumps over the lazy dog")
PARAMS = tinker.SamplingParams(max_tokens=8, temperature=1.0, seed=3, stop=[])
PROMPT = tinker.ModelInput.from_ints(TOKENS[:5])


def step(trainer: tinker.TrainingClient) -> None:
    trainer.forward_backward([sft_datum(TOKENS)], "cross_entropy").result(timeout=60)
    trainer.optim_step(tinker.AdamParams(learning_rate=5e-2)).result(timeout=60)


def test_rl_shaped_loop_keeps_resident_weights_bounded(
    server: ServerProcess, service: tinker.ServiceClient, tiny_dir: Path
) -> None:
    trainer = service.create_lora_training_client(str(tiny_dir), rank=4).result(timeout=120)
    first = trainer.save_weights_and_get_sampling_client().result(timeout=60)
    first_tokens = [s.tokens for s in first.sample(PROMPT, 2, PARAMS).result(timeout=60).sequences]
    resident: list[int] = []
    copies: list[int] = []
    for _ in range(6):
        step(trainer)
        client = trainer.save_weights_and_get_sampling_client().result(timeout=60)
        client.sample(PROMPT, 2, PARAMS).result(timeout=60)
        resident.append(health(server)["resident_sampler_weights"])
        copies.append(health(server)["sampler_decode_copies"])
    # One set of weights per step was made; never more than RESIDENT stayed in memory.
    assert max(resident) <= RESIDENT
    assert resident[-1] == RESIDENT
    # Each snapshot decoded from a merged copy (float32), and only the latest kept it.
    assert copies == [DECODE_COPIES] * 6
    # The first sampler was evicted long ago (its adapter spilled): it answers as before.
    again = [s.tokens for s in first.sample(PROMPT, 2, PARAMS).result(timeout=60).sequences]
    assert again == first_tokens
    # And the weights really differ between the first and the last snapshot.
    last = [s.tokens for s in client.sample(PROMPT, 2, PARAMS).result(timeout=60).sequences]
    assert last != first_tokens


def test_one_snapshot_per_weights_version(server: ServerProcess, tiny_dir: Path) -> None:
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    try:
        trainer = service.create_lora_training_client(str(tiny_dir), rank=4).result(timeout=120)
        step(trainer)
        before = health(server)["resident_sampler_weights"]
        a = trainer.save_weights_and_get_sampling_client().result(timeout=60)
        b = trainer.save_weights_and_get_sampling_client().result(timeout=60)
        a.sample(PROMPT, 1, PARAMS).result(timeout=60)
        b.sample(PROMPT, 1, PARAMS).result(timeout=60)
        # Both sessions share one weight set (the count grows by at most one, bounded by the pool).
        assert health(server)["resident_sampler_weights"] <= min(before + 1, RESIDENT)
        assert a.sample(PROMPT, 2, PARAMS).result(timeout=60).sequences[0].tokens == (
            b.sample(PROMPT, 2, PARAMS).result(timeout=60).sequences[0].tokens
        )
    finally:
        service.close("success").result(timeout=30)


def test_inflight_clients_follow_the_latest_save(service: tinker.ServiceClient, tiny_dir: Path) -> None:
    trainer = service.create_lora_training_client(str(tiny_dir), rank=4).result(timeout=120)
    seq = tinker.ModelInput.from_ints(TOKENS[:12])
    early = trainer.save_weights_and_get_sampling_client(kind="inflight").result(timeout=60)
    frozen = trainer.save_weights_and_get_sampling_client().result(timeout=60)
    before = early.compute_logprobs(seq).result(timeout=60)
    step(trainer)
    late = trainer.save_weights_and_get_sampling_client(kind="inflight").result(timeout=60)
    # The earlier inflight client now samples from the new weights, like the new one ...
    updated = early.compute_logprobs(seq).result(timeout=60)
    np.testing.assert_allclose(
        np.asarray(updated[1:], dtype=np.float32),
        np.asarray(late.compute_logprobs(seq).result(timeout=60)[1:], dtype=np.float32),
        atol=1e-6,
    )
    assert not np.allclose(np.asarray(updated[1:], np.float32), np.asarray(before[1:], np.float32))
    # ... while a snapshot client keeps the weights it was made with.
    np.testing.assert_allclose(
        np.asarray(frozen.compute_logprobs(seq).result(timeout=60)[1:], dtype=np.float32),
        np.asarray(before[1:], dtype=np.float32),
        atol=1e-6,
    )


def test_a_finished_session_releases_its_weights(server: ServerProcess, tiny_dir: Path) -> None:
    held = health(server)["sampler_weights"]
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    trainer = service.create_lora_training_client(str(tiny_dir), rank=4).result(timeout=120)
    for _ in range(3):
        step(trainer)
        trainer.save_weights_and_get_sampling_client().result(timeout=60).sample(PROMPT, 1, PARAMS).result(
            timeout=60
        )
    assert health(server)["sampler_weights"] == held + 3
    service.close("success").result(timeout=30)
    # This session's three weight sets are gone (from memory and from the spill directory).
    assert health(server)["sampler_weights"] == held
