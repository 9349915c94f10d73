"""Decoding from a LoRA sampler snapshot, compiled decode step on and off (interleaved rounds):
64 prompts × 64 new tokens at temperature 1 from a fresh ``save_weights_and_get_sampling_client``
snapshot of a rank-32 LoRA client each round, as an RL step samples.

Usage::

    PYTHONPATH=python:protocols .venv/bin/python tests/benchmarks/lora_decode.py [MODEL_DIR] [ROUNDS]

MODEL_DIR defaults to ``/tmp/smollm2-hf`` (docs/models.md); bfloat16, 2 torch threads.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import engine_scale as es

from tempering.local import ServiceClient


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "/tmp/smollm2-hf"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    service = ServiceClient(root=tempfile.mkdtemp(), device="cpu", dtype="bfloat16", num_threads=2)
    trainer = service.create_lora_training_client(model, rank=32).result()
    es.train_step(trainer, es.training_data(4, 64, 49152))  # a non-zero adapter
    prompts = es.random_prompts(64, 32, 49152)
    rates: dict[str, list[float]] = {"1": [], "0": []}
    for r in range(rounds + 1):  # the first round of each warms up (and compiles)
        for setting in rates:
            os.environ["TEMPERING_COMPILE_DECODE"] = setting
            sampler = trainer.save_weights_and_get_sampling_client()
            start = time.perf_counter()
            tokens = es.sample_engine(sampler, prompts, 64)
            if r:
                rates[setting].append(tokens / (time.perf_counter() - start))
            sampler.close()
    for setting, values in rates.items():
        label = "compiled" if setting == "1" else "not compiled"
        print(
            f"{label}: median {statistics.median(values):.0f} tokens/s, rounds {[round(v) for v in values]}"
        )
    service.close()


if __name__ == "__main__":
    main()
