"""Decoding on the CPU at a real model's size: 64 prompts × 64 new tokens at temperature 1
(full distribution, no stop), the local engine's ``LocalSamplingClient`` against transformers'
``model.generate`` on the same weights, dtype and prompts, in one run, rounds interleaved
(generate, engine, generate, engine, ...) so that a busy machine slows both alike.

Model: ``$TEMPERING_BENCH_MODEL``, else ``/tmp/smollm2-hf`` (a Hugging Face directory of
SmolLM2-135M-Instruct) when it exists, else the built-in tiny model. Dtype:
``$TEMPERING_BENCH_DTYPE`` (default float32). Threads: torch's default (``$TEMPERING_NUM_THREADS``
to set them). The engine compiles its decode step as it chooses
(``$TEMPERING_COMPILE_DECODE``, recorded as ``compiled_decode``). Rounds:
``$TEMPERING_BENCH_ROUNDS`` (default 3, after one warm-up round each).

Recorded in ``extra_info`` (``--benchmark-json``) and printed: tokens/s of both (median round;
also the best round, and every round's seconds), their ratio, the machine's matmul peak in
float32 and bfloat16 (a 2048 × 2048 product, best round) and the fraction of the peak (in the
dtype used) that each side's decoding reaches, at ``engine_scale.ModelShape.decode_flops`` per
decoded token. Runs under ``make bench`` only (skipped under plain pytest: a round takes half a
minute or more with the 135M model); the same code runs at small sizes in
tests/benchmarks/test_gpu_check.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import engine_scale as es
import pytest
import torch
from pytest_benchmark.fixture import BenchmarkFixture

from tempering.local import TINY_MODEL, ServiceClient
from tempering.local.compiled_decode import compile_wanted
from tempering.local.engine_thread import run_on_engine_thread
from tempering.local.model import resolve_model_dir

BATCH, PROMPT_TOKENS, NEW_TOKENS = 64, 32, 64
MATMUL_N = 2048


def _model() -> str:
    chosen = os.environ.get("TEMPERING_BENCH_MODEL") or "/tmp/smollm2-hf"
    return chosen if (Path(chosen) / "config.json").is_file() else TINY_MODEL


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceClient]:
    dtype = os.environ.get("TEMPERING_BENCH_DTYPE") or "float32"
    client = ServiceClient(root=tmp_path_factory.mktemp("bench-decode"), device="cpu", dtype=dtype)
    yield client
    client.close()


@pytest.mark.benchmark(group="decode-64x64")
def test_decode_engine_vs_generate(benchmark: BenchmarkFixture, service: ServiceClient) -> None:
    if benchmark.disabled:
        pytest.skip("a real-size decoding benchmark: runs under `make bench` (--benchmark-enable)")
    rounds = int(os.environ.get("TEMPERING_BENCH_ROUNDS") or 3)
    cpu, dtype = torch.device("cpu"), service.placement.dtype
    dtype_name = next(name for name, dt in es.DTYPES.items() if dt == dtype)
    model = _model()
    model_dir = resolve_model_dir(model, service.root)
    shape = es.ModelShape.of_dir(model_dir)
    # Every torch call of this test runs on the engine's thread, as the engine's own work does:
    # a second thread running torch would start a second OpenMP pool, which slows both sides
    # (local/engine_thread.py).
    peaks = {
        name: run_on_engine_thread(lambda dt=dt: es.matmul_peak(cpu, dt, MATMUL_N)).result()
        for name, dt in es.DTYPES.items()
    }
    prompts = es.random_prompts(BATCH, PROMPT_TOKENS, shape.vocab)
    sampler = es.engine_sampler(service, model)
    hf = run_on_engine_thread(lambda: es.load_hf(model_dir, cpu, dtype)).result()
    generate_s: list[float] = []

    def generate_round() -> None:
        start = time.perf_counter()
        run_on_engine_thread(lambda: es.sample_generate(hf, prompts, NEW_TOKENS)).result()
        generate_s.append(time.perf_counter() - start)

    tokens = benchmark.pedantic(
        lambda: es.sample_engine(sampler, prompts, NEW_TOKENS),
        setup=generate_round,
        rounds=rounds,
        warmup_rounds=1,
    )
    compiled = compile_wanted(hf, cpu)  # the same weights as the engine's model
    sampler.close()
    assert tokens == BATCH * NEW_TOKENS
    engine = es.Timing(tokens, tuple(benchmark.stats.stats.data))
    generate = es.Timing(tokens, tuple(generate_s[1:]))  # the first was the warm-up round's
    flops = shape.decode_flops(PROMPT_TOKENS, NEW_TOKENS)
    info = {
        "model": model,
        "params": shape.params,
        "dtype": dtype_name,
        "torch_threads": run_on_engine_thread(torch.get_num_threads).result(),
        "compiled_decode": compiled,
        "tokens": tokens,
        "engine_tokens_per_s": engine.tokens_per_s,
        "generate_tokens_per_s": generate.tokens_per_s,
        "engine_over_generate": engine.tokens_per_s / generate.tokens_per_s,
        "engine_tokens_per_s_best": tokens / engine.best,
        "generate_tokens_per_s_best": tokens / generate.best,
        "engine_seconds": list(engine.seconds),
        "generate_seconds": list(generate.seconds),
        "matmul_peak_flops_float32": peaks["float32"],
        "matmul_peak_flops_bfloat16": peaks["bfloat16"],
        "decode_flops_per_token": flops,
        "engine_fraction_of_peak": engine.tokens_per_s * flops / peaks[dtype_name],
        "generate_fraction_of_peak": generate.tokens_per_s * flops / peaks[dtype_name],
    }
    benchmark.extra_info.update(info)
    print(
        "\n" + "\n".join(f"{k}: {v:,.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in info.items())
    )
