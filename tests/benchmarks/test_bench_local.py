"""Benchmarks of the local engine, each beside its baseline in the same group.

- ``local-sample-16``: one prompt (32 tokens), 16 samples of 64 tokens at temperature 1, no
  stop: the engine's ``sample`` against ``transformers``' own ``model.generate`` on the same
  weights and settings.
- ``local-sample-4x16``: four prompts of different lengths, 16 samples each, submitted at once
  (the engine coalesces them) against one ``generate`` call on the 64 left-padded rows.
- ``local-forward-backward``: 16 datums of 128 tokens, cross-entropy; the engine's
  ``forward_backward`` (LoRA rank 32 and full fine-tuning) against a plain transformers
  forward + loss + backward of the same batch.

- ``local-train-memory`` (``make bench`` only): the growth of peak memory over a one-row
  warm-up for one LoRA (rank 32) ``forward_backward`` of 16, 64 and 256 rows of
  ``$BENCH_MEM_LEN`` (128) tokens, each in a fresh process (``local_train_worker.py``): under a
  micro-batch budget of ``$BENCH_MEM_BUDGET`` (2048) tokens, and as one whole batch. The CPU's
  peak RSS (``ru_maxrss``), or ``torch.cuda.max_memory_allocated`` with
  ``BENCH_TRAIN_DEVICE=cuda``.
- ``local-train-throughput`` (``make bench`` only): training steps (``forward_backward`` +
  ``optim_step``) of LoRA rank 32 on 64 sequences x 256 tokens; tokens/s and model FLOPs
  utilisation against the best plain matrix product (of the model's dtype) measured in the
  same run, before and after.

The training benchmarks use ``$BENCH_TRAIN_MODEL``, else the 135M model at /tmp/smollm2-hf when
it is there, else the tiny model.

Tokens per call are recorded in ``extra_info``; tokens/s = tokens / time. All run with one
torch thread (set for the whole process by the service client): the tiny model gains nothing
from more, and a shared machine makes OpenMP's threads wait on each other. Run with
``make bench``; under plain pytest (``--benchmark-disable``) each runs once, as a smoke test
(the training-memory and throughput ones are skipped there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from local_train_worker import make_data
from pytest_benchmark.fixture import BenchmarkFixture
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from tempering.local import LocalSamplingClient, LocalTrainingClient, ServiceClient
from tempering.local._hf import quiet_progress
from tempering.local.checkpoints import CheckpointStore
from tempering.local.loader import LoraShape, ModelLoader
from tempering.local.microbatch import activation_bytes_per_token
from tempering.local.model import hf_model as unwrap_hf_model
from tempering.local.model import resolve_model_dir, resolve_placement
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


# ---- training within a memory budget ------------------------------------------------------------

WORKER = Path(__file__).with_name("local_train_worker.py")
SMOLLM2 = Path("/tmp/smollm2-hf")
TRAIN_MODEL = os.environ.get("BENCH_TRAIN_MODEL") or (
    str(SMOLLM2) if (SMOLLM2 / "config.json").is_file() else TINY_MODEL
)
TRAIN_DEVICE = os.environ.get("BENCH_TRAIN_DEVICE", "cpu")
MEM_LEN = int(os.environ.get("BENCH_MEM_LEN", "128"))
MEM_BUDGET = int(os.environ.get("BENCH_MEM_BUDGET", "2048"))


@pytest.mark.benchmark(group="local-train-memory")
@pytest.mark.parametrize("split", ["budget", "whole"])
@pytest.mark.parametrize("rows", [16, 64, 256])
def test_forward_backward_peak_memory(
    benchmark: BenchmarkFixture, service: ServiceClient, rows: int, split: str
) -> None:
    if benchmark.disabled:
        pytest.skip("a fresh process per size: make bench only")
    budget = MEM_BUDGET if split == "budget" else 0
    if split == "whole":
        config = AutoConfig.from_pretrained(resolve_model_dir(TRAIN_MODEL, service.root))
        dtype = resolve_placement(TRAIN_DEVICE, None).dtype
        need = rows * MEM_LEN * activation_bytes_per_token(config, dtype, checkpointing=False)
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if TRAIN_DEVICE == "cpu" and need > total / 4:
            pytest.skip(f"the whole batch would need about {need / 2**30:.0f} GiB of activations")
    command = [sys.executable, str(WORKER), "memory", TRAIN_MODEL, str(rows), str(MEM_LEN)]
    command += [str(budget), TRAIN_DEVICE, str(service.root)]

    def run() -> dict[str, float]:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    result = benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    benchmark.extra_info["model"] = TRAIN_MODEL
    benchmark.extra_info["growth_mib"] = round(result["growth"] / 2**20, 1)
    print(f"\n{TRAIN_MODEL} {rows}x{MEM_LEN} {split}: peak grew {result['growth'] / 2**20:.0f} MiB")


def _matmul_peak(dtype: torch.dtype, device: torch.device, seconds: float = 3.0) -> float:
    """The best FLOP/s of a plain square matrix product in this process (1024 on the CPU,
    8192 on CUDA), over about ``seconds``."""
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def _lora_training_flops_per_token(model: torch.nn.Module, length: int) -> float:
    """Model FLOPs of one token of LoRA training: forward and the activations' backward through
    every base matrix (4 per weight), forward and both backwards through the adapters (6 per
    weight), and causal attention (``6 * length * hidden`` per layer). Recomputation is not
    counted (by definition of model FLOPs utilisation)."""
    base = lora = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            if "lora_" in name:
                lora += module.weight.numel()
            else:
                base += module.weight.numel()
    config = unwrap_hf_model(model).config
    attention = 6 * length * int(config.hidden_size) * int(config.num_hidden_layers)
    return 4 * base + 6 * lora + attention


@pytest.mark.benchmark(group="local-train-throughput")
def test_training_tokens_per_second_lora32(benchmark: BenchmarkFixture, service: ServiceClient) -> None:
    if benchmark.disabled:
        pytest.skip("64 x 256 tokens per step: make bench only")
    rows, length = 64, 256
    placement = resolve_placement(TRAIN_DEVICE, None)
    loader = ModelLoader(CheckpointStore(service.root), placement)
    client = loader.trainer(TRAIN_MODEL, LoraShape(rank=32))
    data = make_data(rows, length, min(int(client.get_tokenizer().vocab_size), 256))
    flops_per_token = _lora_training_flops_per_token(client._model, length)
    peak_before = _matmul_peak(placement.dtype, placement.device)

    def step() -> float:
        fb = client.forward_backward(data, "cross_entropy")
        opt = client.optim_step(tinker.AdamParams(learning_rate=1e-4))
        loss = fb.result().metrics["loss:sum"]
        opt.result()
        return loss

    rounds = int(os.environ.get("BENCH_TRAIN_ROUNDS", "3"))
    loss = benchmark.pedantic(step, rounds=rounds, iterations=1, warmup_rounds=0)
    assert np.isfinite(loss)
    peak = max(peak_before, _matmul_peak(placement.dtype, placement.device))
    seconds = benchmark.stats.stats.median
    tokens_per_s = rows * length / seconds
    mfu = tokens_per_s * flops_per_token / peak
    info = {
        "model": TRAIN_MODEL,
        "device": str(placement.device),
        "dtype": str(placement.dtype),
        "threads": torch.get_num_threads(),
        "tokens": rows * length,
        "max_batch_tokens": client.max_batch_tokens,
        "tokens_per_s": round(tokens_per_s, 1),
        "model_gflop_per_token": round(flops_per_token / 1e9, 4),
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "mfu": round(mfu, 4),
    }
    benchmark.extra_info.update(info)
    print("\n" + json.dumps(info))
    client.close()
