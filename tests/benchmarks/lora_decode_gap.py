"""What each way of decoding a LoRA snapshot costs in correctness (``TEMPERING_LORA_DECODE``).

A rank-32 LoRA client takes one optimizer step (learning rate ``--lr``); for each setting a fresh
snapshot samples 16 prompts × 32 new tokens (the same seeds), and the trainer's ``forward``
scores the same tokens. Reported per setting, over the sampled tokens:

- ``gap``: mean and max of |sampled logprob - trainer logprob|, and the mean of the difference
  (the estimate of KL(sampler || trainer) that ``kl/sample_train`` logs);
- ``update``: mean |trainer logprob after the step - before it| on the same tokens: the size of
  the change the sampler must reflect. A gap near the update means the sampler lags a step.

Usage::

    PYTHONPATH=python:protocols .venv/bin/python tests/benchmarks/lora_decode_gap.py \\
        [--model /tmp/smollm2-hf] [--dtype bfloat16] [--lr 1e-4] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import engine_scale as es
import numpy as np
import tinker

from tempering.local import LocalTrainingClient, ServiceClient

SETTINGS = ("as-trained", "cast", "merge")


def _forward(
    trainer: LocalTrainingClient, prompts: list[list[int]], samples: list[list[int]]
) -> list[np.ndarray]:
    data = [
        tinker.Datum(
            model_input=tinker.ModelInput.from_ints([*p, *s][:-1]),
            loss_fn_inputs={"target_tokens": [*p, *s][1:], "weights": [0.0] * (len(p) - 1) + [1.0] * len(s)},
        )
        for p, s in zip(prompts, samples, strict=True)
    ]
    out = trainer.forward(data, "cross_entropy").result()
    return [
        o["logprobs"].to_numpy()[len(p) - 1 :].astype(np.float64)
        for p, o in zip(prompts, out.loss_fn_outputs, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description="sampler/trainer logprob gap per LoRA decoding setting")
    parser.add_argument("--model", default="/tmp/smollm2-hf")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    service = ServiceClient(root=tempfile.mkdtemp(), device="cpu", dtype=args.dtype, num_threads=args.threads)
    trainer = service.create_lora_training_client(args.model, rank=32).result()
    es.train_step(trainer, es.training_data(16, 64, 49152, seed=1), args.lr)  # B is non-zero from here
    prompts = es.random_prompts(16, 32, 49152)
    params = [tinker.SamplingParams(max_tokens=32, temperature=1.0, stop=[], seed=100 + i) for i in range(16)]
    reference: list[list[int]] | None = None
    before: list[np.ndarray] = []
    print(f"{args.dtype}, one step at lr {args.lr:g}, 16 prompts × 32 tokens")
    for setting in SETTINGS:
        os.environ["TEMPERING_LORA_DECODE"] = setting
        sampler = trainer.save_weights_and_get_sampling_client()
        futures = [
            sampler.sample(tinker.ModelInput.from_ints(p), 1, sp)
            for p, sp in zip(prompts, params, strict=True)
        ]
        seqs = [f.result().sequences[0] for f in futures]
        sampler.close()
        if reference is None:
            reference = [list(s.tokens) for s in seqs]
            before = _forward(trainer, prompts, reference)
        trained = _forward(trainer, prompts, [list(s.tokens) for s in seqs])
        diff = np.concatenate(
            [np.asarray(s.logprobs, dtype=np.float64) - t for s, t in zip(seqs, trained, strict=True)]
        )
        same = sum(list(s.tokens) == r for s, r in zip(seqs, reference, strict=True))
        print(
            f"{setting}: gap mean {np.abs(diff).mean():.2e} max {np.abs(diff).max():.2e}, "
            f"mean(sampled - trainer) {diff.mean():+.2e}; {same}/16 sequences as {SETTINGS[0]}'s"
        )
    assert reference is not None
    es.train_step(trainer, es.training_data(16, 64, 49152, seed=2), args.lr)
    after = _forward(trainer, prompts, reference)
    update = np.concatenate([np.abs(a - b) for a, b in zip(after, before, strict=True)])
    print(f"update: one more step moves the trainer's logprobs by {update.mean():.2e} on average")
    service.close()


if __name__ == "__main__":
    main()
