"""Decoding from a LoRA sampler snapshot, one setting against another (interleaved rounds):
64 prompts × 64 new tokens at temperature 1 from a fresh ``save_weights_and_get_sampling_client``
snapshot of a rank-32 LoRA client each round, as an RL step samples. The base model's own
sampler runs in the same rounds for reference.

Usage::

    PYTHONPATH=python:protocols .venv/bin/python tests/benchmarks/lora_decode.py \\
        [--model MODEL_DIR] [--rounds 3] [--dtype bfloat16] [--compare compile|lora] [--threads 2]

``--compare compile`` alternates ``TEMPERING_COMPILE_DECODE=1`` and ``0``; ``--compare lora``
alternates ``TEMPERING_LORA_DECODE=merge``, ``cast`` and ``as-trained`` (the adapter merged into
the snapshot's decode weights, cast to the model's dtype, or as the trainer holds it).
MODEL_DIR defaults to ``/tmp/smollm2-hf`` (docs/models.md); ``--threads`` torch threads (2).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import engine_scale as es

from tempering.local import ServiceClient

SETTINGS = {
    "compile": ("TEMPERING_COMPILE_DECODE", {"1": "compiled", "0": "not compiled"}),
    "lora": ("TEMPERING_LORA_DECODE", {"merge": "merged", "cast": "cast", "as-trained": "as trained"}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description="LoRA sampler decoding, one setting against another")
    parser.add_argument("--model", default="/tmp/smollm2-hf")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compare", choices=sorted(SETTINGS), default="compile")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    env, labels = SETTINGS[args.compare]
    service = ServiceClient(root=tempfile.mkdtemp(), device="cpu", dtype=args.dtype, num_threads=args.threads)
    trainer = service.create_lora_training_client(args.model, rank=32).result()
    es.train_step(trainer, es.training_data(4, 64, 49152))  # a non-zero adapter
    base = es.engine_sampler(service, args.model)
    prompts = es.random_prompts(64, 32, 49152)
    rates: dict[str, list[float]] = {label: [] for label in [*labels.values(), "base model"]}
    for r in range(args.rounds + 1):  # the first round of each warms up (and compiles)
        for setting, label in [*labels.items(), (None, "base model")]:
            if setting is not None:
                os.environ[env] = setting
            sampler = base if setting is None else trainer.save_weights_and_get_sampling_client()
            start = time.perf_counter()
            tokens = es.sample_engine(sampler, prompts, 64)
            if r:
                rates[label].append(tokens / (time.perf_counter() - start))
            if setting is not None:
                sampler.close()
    print(f"{args.dtype}, {env} alternated, {args.rounds} rounds")
    for label, values in rates.items():
        rounds = [round(v) for v in values]
        print(f"{label}: median {statistics.median(values):.0f} tokens/s, rounds {rounds}")
    service.close()


if __name__ == "__main__":
    main()
