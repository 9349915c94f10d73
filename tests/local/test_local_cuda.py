"""The local engine on a GPU: float32 on CUDA matches the CPU, bfloat16 (the CUDA default)
trains and samples, and checkpoints move between devices. Skipped where torch sees no CUDA
device (CI has none); run on a GPU machine with ``pytest tests/local/test_local_cuda.py``, and
the whole local suite there with ``TEMPERING_TEST_DEVICE=cuda`` (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from local_helpers import rl_datum, sft_datum

from tempering.local import ServiceClient

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _batch(seed: int, n: int = 8) -> list[tinker.Datum]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        word = [int(t) for t in rng.integers(97, 123, size=int(rng.integers(2, 6)))]
        prompt = [258, *word, 10]
        answer = [*word, 259]
        out.append(sft_datum(prompt + answer, [0.0] * (len(prompt) - 1) + [1.0] * len(answer)))
    return out


@pytest.fixture(scope="module")
def cpu(local_root: Path) -> Iterator[ServiceClient]:
    client = ServiceClient(root=local_root, device="cpu", dtype="float32", num_threads=1)
    yield client
    client.close()


@pytest.fixture(scope="module")
def cuda32(local_root: Path) -> Iterator[ServiceClient]:
    client = ServiceClient(root=local_root, device="cuda", dtype="float32")
    yield client
    client.close()


@pytest.fixture(scope="module")
def cuda_default(local_root: Path) -> Iterator[ServiceClient]:
    client = ServiceClient(root=local_root, device="cuda")
    yield client
    client.close()


def _logprobs(out: tinker.ForwardBackwardOutput) -> list[np.ndarray]:
    return [np.asarray(o["logprobs"].to_numpy(), dtype=np.float64) for o in out.loss_fn_outputs]


def test_default_dtype_on_cuda_is_bfloat16(cuda_default: ServiceClient) -> None:
    assert cuda_default.placement.device.type == "cuda"
    assert cuda_default.placement.dtype == torch.bfloat16


def test_float32_training_on_cuda_matches_the_cpu(cpu: ServiceClient, cuda32: ServiceClient) -> None:
    """Same seed, same data: losses and logprobs agree step by step, full fine-tuning and LoRA."""
    for make in (
        lambda s: s.create_full_training_client("tempering/tiny"),
        lambda s: s.create_lora_training_client("tempering/tiny", rank=8, seed=3),
    ):
        a, b = make(cpu).result(), make(cuda32).result()
        for step in range(4):
            data = _batch(step)
            out_a = a.forward_backward(data, "cross_entropy").result()
            out_b = b.forward_backward(data, "cross_entropy").result()
            for x, y in zip(_logprobs(out_a), _logprobs(out_b), strict=True):
                np.testing.assert_allclose(x, y, atol=2e-4)
            adam = tinker.AdamParams(learning_rate=3e-3)
            a.optim_step(adam).result()
            b.optim_step(adam).result()
        data = _batch(99)
        rl = [
            rl_datum(
                [*d.model_input.to_ints(), int(d.loss_fn_inputs["target_tokens"].to_numpy()[-1])],
                [-1.0] * d.model_input.length,
                [0.5] * d.model_input.length,
            )
            for d in data
        ]
        for loss in ("importance_sampling", "ppo", "cispo"):
            out_a = a.forward(rl, loss).result()
            out_b = b.forward(rl, loss).result()
            for x, y in zip(_logprobs(out_a), _logprobs(out_b), strict=True):
                np.testing.assert_allclose(x, y, atol=2e-4)


def test_bfloat16_training_lowers_the_loss_and_samples(cuda_default: ServiceClient) -> None:
    client = cuda_default.create_lora_training_client("tempering/tiny", rank=16).result()
    held_out = _batch(1000, 16)
    weight = sum(float(d.loss_fn_inputs["weights"].to_numpy().sum()) for d in held_out)

    def loss() -> float:
        return client.forward(held_out, "cross_entropy").result().metrics["loss:sum"] / weight

    before = loss()
    for step in range(60):
        client.forward_backward(_batch(step, 16), "cross_entropy")
        client.optim_step(tinker.AdamParams(learning_rate=3e-3))
    after = loss()
    assert np.isfinite(after)
    assert after < 0.6 * before, (before, after)

    sampler = client.save_weights_and_get_sampling_client()
    prompt = tinker.ModelInput.from_ints([258, 104, 101, 121, 10])
    params = tinker.SamplingParams(max_tokens=8, temperature=1.0, seed=5, stop=[259])
    first = sampler.sample(prompt, 4, params).result()
    again = sampler.sample(prompt, 4, params).result()
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]
    for seq in first.sequences:
        assert 0 < len(seq.tokens) <= 8
        assert seq.logprobs is not None
        assert all(np.isfinite(seq.logprobs))
        # the sampler's logprobs are those of the trained weights (bfloat16 tolerance)
        full = [*prompt.to_ints(), *seq.tokens]
        lp = sampler.compute_logprobs(tinker.ModelInput.from_ints(full)).result()
        tail = np.asarray(lp[prompt.length :], dtype=np.float64)
        np.testing.assert_allclose(tail, np.asarray(seq.logprobs), atol=0.1)


def test_checkpoints_move_between_cuda_and_cpu(cpu: ServiceClient, cuda32: ServiceClient) -> None:
    trained = cuda32.create_lora_training_client("tempering/tiny", rank=8, seed=1).result()
    for step in range(3):
        trained.forward_backward(_batch(step), "cross_entropy")
        trained.optim_step(tinker.AdamParams(learning_rate=3e-3))
    state = trained.save_state("cuda-to-cpu").result().path
    probe = _batch(7)
    on_gpu = _logprobs(trained.forward(probe, "cross_entropy").result())
    restored = cpu.create_training_client_from_state_with_optimizer(state).result()
    on_cpu = _logprobs(restored.forward(probe, "cross_entropy").result())
    for x, y in zip(on_gpu, on_cpu, strict=True):
        np.testing.assert_allclose(x, y, atol=2e-4)
    # one more identical step on both: the optimizer state came along
    for client in (trained, restored):
        client.forward_backward(_batch(50), "cross_entropy")
        client.optim_step(tinker.AdamParams(learning_rate=3e-3)).result()
    for x, y in zip(
        _logprobs(trained.forward(probe, "cross_entropy").result()),
        _logprobs(restored.forward(probe, "cross_entropy").result()),
        strict=True,
    ):
        np.testing.assert_allclose(x, y, atol=5e-4)
