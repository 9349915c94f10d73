"""``tempering serve``'s resident memory over an RL-shaped SDK loop (issue 25's memory target).

Each step does what an RL recipe does through the official SDK: ``forward_backward`` on a
batch, ``optim_step``, ``save_weights_and_get_sampling_client``, sample a group from it, and drop
the client. The server's resident set size (``VmRSS``) is read after every step; the figure of
merit is its growth from the end of the warm-up to the last step, in model copies.

Run (on demand; the real model takes minutes)::

    python tests/benchmarks/serve_memory.py --model /path/to/SmolLM2-135M-Instruct --steps 100

Prints one JSON line per step and a summary line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tinker

from tempering.serve.testing import API_KEY, ServerProcess


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def datum(rng: np.random.Generator, length: int, vocab: int) -> tinker.Datum:
    tokens = rng.integers(10, vocab, size=length + 1)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1].tolist()),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(tokens[1:].astype(np.int64)),
            "logprobs": tinker.TensorData.from_numpy(np.full(length, -2.0, dtype=np.float32)),
            "advantages": tinker.TensorData.from_numpy(rng.normal(size=length).astype(np.float32)),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local HF model directory")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10, help="steps before the baseline RSS")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--rank", type=int, default=32)
    args = parser.parse_args()
    model_dir = Path(args.model).resolve()
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    root = Path(tempfile.mkdtemp(prefix="serve-memory-"))
    server = ServerProcess(root / "data", root / "home").start()
    try:
        pid = server.pid
        assert pid is not None
        service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
        trainer = service.create_lora_training_client(str(model_dir), rank=args.rank).result(timeout=600)
        vocab = trainer.get_tokenizer().vocab_size
        rng = np.random.default_rng(0)
        params = tinker.SamplingParams(max_tokens=16, temperature=1.0, seed=0)
        baseline = 0
        series: list[int] = []
        for step in range(args.steps):
            start = time.monotonic()
            data = [datum(rng, args.length, vocab) for _ in range(args.batch)]
            trainer.forward_backward(data, "importance_sampling").result(timeout=600)
            trainer.optim_step(tinker.AdamParams(learning_rate=1e-5)).result(timeout=600)
            client = trainer.save_weights_and_get_sampling_client().result(timeout=600)
            prompt = tinker.ModelInput.from_ints(rng.integers(10, vocab, size=32).tolist())
            client.sample(prompt, 8, params).result(timeout=600)
            del client
            rss = rss_bytes(pid)
            series.append(rss)
            if step + 1 == args.warmup:
                baseline = rss
            print(
                json.dumps(
                    {"step": step, "rss_mb": round(rss / 2**20, 1), "s": round(time.monotonic() - start, 2)}
                )
            )
            sys.stdout.flush()
        service.close("success").result(timeout=60)
        growth = series[-1] - baseline
        print(
            json.dumps(
                {
                    "summary": True,
                    "model_weights_mb": round(weights / 2**20, 1),
                    "rss_after_warmup_mb": round(baseline / 2**20, 1),
                    "rss_last_mb": round(series[-1] / 2**20, 1),
                    "rss_max_mb": round(max(series) / 2**20, 1),
                    "growth_mb": round(growth / 2**20, 1),
                    "growth_model_copies": round(growth / weights, 3),
                    "steps": args.steps,
                }
            )
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
