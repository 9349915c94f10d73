"""Benchmarks of the local engine, each beside its baseline in the same group.

- ``local-sample-16``: one prompt (32 tokens), 16 samples of 64 tokens at temperature 1, no
  stop: the engine's ``sample`` against ``transformers``' own ``model.generate`` on the same
  weights and settings.
- ``local-sample-4x16``: four prompts of different lengths, 16 samples each, submitted at once
  (the engine coalesces them) against one ``generate`` call on the 64 left-padded rows.
- ``local-forward-backward``: 16 datums of 128 tokens, cross-entropy; the engine's
  ``forward_backward`` (LoRA rank 32 and full fine-tuning) against a plain transformers
  forward + loss + backward of the same batch.

Tokens per call are recorded in ``extra_info``; tokens/s = tokens / time. All run with one
torch thread (set for the whole process by the service client): the tiny model gains nothing
from more, and a shared machine makes OpenMP's threads wait on each other. Run with
``make bench``; under plain pytest (``--benchmark-disable``) each runs once, as a smoke test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from pytest_benchmark.fixture import BenchmarkFixture
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from tempering.local import LocalSamplingClient, LocalTrainingClient, ServiceClient
from tempering.local._hf import quiet_progress
from tempering.local.tiny import TINY_MODEL, tiny_model_dir

NUM_SAMPLES, MAX_TOKENS, PROMPT_LEN = 16, 64, 32
FB_BATCH, FB_LEN = 16, 128


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceClient]:
    client = ServiceClient(root=tmp_path_factory.mktemp("bench-home"), device="cpu", num_threads=1)
    yield client
    client.close()


@pytest.fixture(scope="module")
def tiny_dir(service: ServiceClient) -> Path:
    return tiny_model_dir(service.root)


@pytest.fixture(scope="module")
def hf_model(tiny_dir: Path) -> PreTrainedModel:
    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="module")
def sampler(service: ServiceClient) -> Iterator[LocalSamplingClient]:
    client = service.create_sampling_client(base_model=TINY_MODEL).result()
    yield client
    client.close()


def _generation_config() -> GenerationConfig:
    # Sampling at temperature 1 from the full distribution, no EOS stop: as the engine's call.
    return GenerationConfig(
        do_sample=True,
        max_new_tokens=MAX_TOKENS,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        eos_token_id=None,
        pad_token_id=260,
        bos_token_id=256,
    )


PROMPT = list(range(40, 40 + PROMPT_LEN))
PROMPTS_4 = [list(range(40, 40 + n)) for n in (8, 32, 20, 14)]


@pytest.mark.benchmark(group="local-sample-16")
def test_sample_local_engine(benchmark: BenchmarkFixture, sampler: LocalSamplingClient) -> None:
    params = tinker.SamplingParams(max_tokens=MAX_TOKENS, stop=[], seed=0)

    def run() -> int:
        response = sampler.sample(tinker.ModelInput.from_ints(PROMPT), NUM_SAMPLES, params).result()
        return sum(len(s.tokens) for s in response.sequences)

    tokens = benchmark(run)
    assert tokens == NUM_SAMPLES * MAX_TOKENS
    benchmark.extra_info["tokens"] = tokens


@pytest.mark.benchmark(group="local-sample-16")
def test_sample_hf_generate(benchmark: BenchmarkFixture, hf_model: PreTrainedModel) -> None:
    ids = torch.tensor([PROMPT] * NUM_SAMPLES)
    mask = torch.ones_like(ids)
    config = _generation_config()

    def run() -> int:
        with torch.inference_mode():
            out = hf_model.generate(ids, attention_mask=mask, generation_config=config)
        return int((out.shape[1] - ids.shape[1]) * out.shape[0])

    tokens = benchmark(run)
    assert tokens == NUM_SAMPLES * MAX_TOKENS
    benchmark.extra_info["tokens"] = tokens


@pytest.mark.benchmark(group="local-sample-4x16")
def test_sample_local_engine_coalesced(benchmark: BenchmarkFixture, sampler: LocalSamplingClient) -> None:
    def run() -> int:
        futures = [
            sampler.sample(
                tinker.ModelInput.from_ints(p),
                NUM_SAMPLES,
                tinker.SamplingParams(max_tokens=MAX_TOKENS, stop=[]),
            )
            for p in PROMPTS_4
        ]
        return sum(len(s.tokens) for f in futures for s in f.result().sequences)

    tokens = benchmark(run)
    assert tokens == 4 * NUM_SAMPLES * MAX_TOKENS
    benchmark.extra_info["tokens"] = tokens


@pytest.mark.benchmark(group="local-sample-4x16")
def test_sample_hf_generate_padded(benchmark: BenchmarkFixture, hf_model: PreTrainedModel) -> None:
    longest = max(len(p) for p in PROMPTS_4)
    rows = [[260] * (longest - len(p)) + p for p in PROMPTS_4 for _ in range(NUM_SAMPLES)]
    ids = torch.tensor(rows)
    mask = (ids != 260).long()
    config = _generation_config()

    def run() -> int:
        with torch.inference_mode():
            out = hf_model.generate(ids, attention_mask=mask, generation_config=config)
        return int((out.shape[1] - ids.shape[1]) * out.shape[0])

    tokens = benchmark(run)
    assert tokens == 4 * NUM_SAMPLES * MAX_TOKENS
    benchmark.extra_info["tokens"] = tokens


def _fb_data() -> list[tinker.Datum]:
    rng = np.random.default_rng(0)
    data = []
    for _ in range(FB_BATCH):
        tokens = [int(t) for t in rng.integers(0, 256, size=FB_LEN + 1)]
        data.append(
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * FB_LEN},
            )
        )
    return data


def _bench_client(benchmark: BenchmarkFixture, client: LocalTrainingClient) -> None:
    data = _fb_data()

    def run() -> float:
        return client.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]

    loss = benchmark(run)
    assert np.isfinite(loss)
    benchmark.extra_info["tokens"] = FB_BATCH * FB_LEN
    client.close()


@pytest.mark.benchmark(group="local-forward-backward")
def test_forward_backward_local_lora(benchmark: BenchmarkFixture, service: ServiceClient) -> None:
    _bench_client(benchmark, service.create_lora_training_client(TINY_MODEL, rank=32).result())


@pytest.mark.benchmark(group="local-forward-backward")
def test_forward_backward_local_full(benchmark: BenchmarkFixture, service: ServiceClient) -> None:
    _bench_client(benchmark, service.create_full_training_client(TINY_MODEL).result())


@pytest.mark.benchmark(group="local-forward-backward")
def test_forward_backward_hf_plain(benchmark: BenchmarkFixture, hf_model: PreTrainedModel) -> None:
    """The floor: one forward, the loss and a backward on ready tensors, nothing else."""
    data = _fb_data()
    ids = torch.tensor([d.model_input.to_ints() for d in data])
    targets = torch.stack([d.loss_fn_inputs["target_tokens"].to_torch() for d in data])

    def run() -> float:
        logits = hf_model(input_ids=ids).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
        loss.backward()
        hf_model.zero_grad(set_to_none=True)
        return float(loss.detach())

    loss = benchmark(run)
    assert np.isfinite(loss)
    benchmark.extra_info["tokens"] = FB_BATCH * FB_LEN
