"""Where a decode round's time goes, engine against transformers' ``generate``: 64 prompts of 32
random tokens, 32 new tokens at T=1, under the torch profiler, both on the engine thread (one
OpenMP pool). Prints each side's wall and profiled time, its ``aten::mm`` share and its six
largest operators; the ratio of ``generate``'s profiled time to its matrix products is the most
an engine that computes the same products could gain over it (docs/benchmarks.md, "one engine
thread").

    PYTHONPATH=python:protocols python tests/benchmarks/decode_profile.py bfloat16 2 [MODEL_DIR]

MODEL_DIR: a Hugging Face directory (default ``/tmp/smollm2-hf``, SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_scale as es

from tempering.local import ServiceClient
from tempering.local.engine_thread import run_on_engine_thread

BATCH, PROMPT_TOKENS, NEW_TOKENS = 64, 32, 32


def profile(run: Callable[[], object]) -> tuple[float, float, dict[str, float]]:
    """Wall seconds, profiled seconds and self time per operator of one call (after a warm-up)."""
    run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
    rows = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    return wall, sum(rows.values()), rows


def main() -> None:
    dtype_name = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    model_dir = Path(sys.argv[3] if len(sys.argv) > 3 else "/tmp/smollm2-hf")
    dtype = es.DTYPES[dtype_name]
    service = ServiceClient(root=tempfile.mkdtemp(), device="cpu", dtype=dtype_name, num_threads=threads)
    shape = es.ModelShape.of_dir(model_dir)
    prompts = es.random_prompts(BATCH, PROMPT_TOKENS, shape.vocab)
    sampler = es.engine_sampler(service, str(model_dir))
    hf = run_on_engine_thread(lambda: es.load_hf(model_dir, torch.device("cpu"), dtype)).result()
    sides: dict[str, Callable[[], object]] = {
        "engine": lambda: es.sample_engine(sampler, prompts, NEW_TOKENS),
        "generate": lambda: es.sample_generate(hf, prompts, NEW_TOKENS),
    }
    for name, run in sides.items():
        wall, total, rows = run_on_engine_thread(lambda run=run: profile(run)).result()
        mm = rows.get("aten::mm", 0.0) + rows.get("aten::addmm", 0.0)
        top = sorted(rows.items(), key=lambda kv: -kv[1])[:6]
        print(
            f"{name} {dtype_name} threads={threads}: wall {wall:.2f} s, profiled {total:.2f} s, "
            f"aten::mm {mm:.2f} s = {100 * mm / total:.0f}%; top: "
            + ", ".join(f"{k} {v:.2f}" for k, v in top),
            flush=True,
        )
    sampler.close()
    service.close()


if __name__ == "__main__":
    main()
