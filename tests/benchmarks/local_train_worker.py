"""One training measurement in a fresh process, printed as one JSON line (used by
tests/benchmarks/test_bench_local.py; a fresh process so that its peak memory is this run's).

    python local_train_worker.py memory MODEL ROWS LENGTH BUDGET DEVICE ROOT
        one LoRA (rank 32) cross-entropy forward_backward of ROWS x LENGTH tokens under a
        micro-batch budget of BUDGET tokens (0: the whole request in one batch); prints the
        growth of peak memory over a one-row warm-up: the process's peak RSS on the CPU
        (``ru_maxrss``), ``torch.cuda.max_memory_allocated`` on CUDA.

MODEL is ``tempering/tiny`` or a Hugging Face model directory; ROOT the checkpoint store.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import numpy as np
import tinker
import torch

from tempering.local.checkpoints import CheckpointStore
from tempering.local.loader import LoraShape, ModelLoader
from tempering.local.model import resolve_placement
from tempering.local.training import TrainingMemory

WHOLE = 1 << 40


def make_data(rows: int, length: int, vocab: int, seed: int = 0) -> list[tinker.Datum]:
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(rows):
        tokens = [int(t) for t in rng.integers(0, vocab, size=length + 1)]
        data.append(
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * length},
            )
        )
    return data


def _peak(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory(model: str, rows: int, length: int, budget: int, device: str, root: str) -> dict[str, object]:
    torch.set_num_threads(1)
    placement = resolve_placement(device, None)
    loader = ModelLoader(
        CheckpointStore(Path(root)), placement, memory=TrainingMemory(max_batch_tokens=budget or WHOLE)
    )
    client = loader.trainer(model, LoraShape(rank=32))
    vocab = min(int(client.get_tokenizer().vocab_size), 256)
    client.forward_backward(make_data(1, length, vocab, seed=1), "cross_entropy").result()
    data = make_data(rows, length, vocab)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = _peak(device)
    loss = client.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    if device == "cuda":
        torch.cuda.synchronize()
    after = _peak(device)
    client.close()
    return {
        "rows": rows,
        "length": length,
        "budget": budget,
        "peak_before": before,
        "peak_after": after,
        "growth": after - before,
        "loss": loss,
    }


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    if kind != "memory" or len(args) != 6:
        raise SystemExit(__doc__)
    print(json.dumps(memory(args[0], int(args[1]), int(args[2]), int(args[3]), args[4], args[5])))
