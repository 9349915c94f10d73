"""Shared helpers for the local engine's tests: datums and hand-written references."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tinker
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from tempering.local._hf import quiet_progress


def sft_datum(tokens: Sequence[int], weights: Sequence[float] | None = None) -> tinker.Datum:
    """Next-token datum over ``tokens``: inputs ``tokens[:-1]``, targets ``tokens[1:]``."""
    tokens = list(tokens)
    w = list(weights) if weights is not None else [1.0] * (len(tokens) - 1)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": w},
    )


def rl_datum(tokens: Sequence[int], logprobs: Sequence[float], advantages: Sequence[float]) -> tinker.Datum:
    tokens = list(tokens)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": np.asarray(logprobs, dtype=np.float32),
            "advantages": np.asarray(advantages, dtype=np.float32),
        },
    )


def random_tokens(rng: np.random.Generator, n: int, high: int = 256) -> list[int]:
    return [int(t) for t in rng.integers(0, high, size=n)]


def reference_model(model_dir: object) -> PreTrainedModel:
    """A fresh copy of the model, loaded by transformers alone (the reference side)."""
    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model


def reference_logprobs(model: PreTrainedModel, inputs: Sequence[int], targets: torch.Tensor) -> torch.Tensor:
    """``log p(targets[t] | inputs[: t + 1])`` for one datum, by a plain forward pass.

    ``targets`` is ``[T]`` or ``[T, K]``; so is the result.
    """
    logits = model(input_ids=torch.tensor([list(inputs)])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    if targets.ndim == 1:
        return logp.gather(1, targets.unsqueeze(1)).squeeze(1)
    return logp.gather(1, targets)


EXPORT_TOKENS = [1, 17, 33, 99, 120, 5, 64, 200, 31, 7, 88, 12]
"""The sequence whose logprobs an exported model must reproduce (tests/local/test_export.py,
tests/serve/test_serve_checkpoints.py)."""


def next_token_logprobs(model: torch.nn.Module, tokens: Sequence[int] = EXPORT_TOKENS) -> list[float]:
    """``log p(tokens[t + 1] | tokens[: t + 1])`` for every ``t``, by a plain forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(tokens)])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[t, tokens[t + 1]]) for t in range(len(tokens) - 1)]


def qwen3_test_model(vocab_size: int) -> PreTrainedModel:
    """A frozen, randomly initialised Qwen3-shaped model (q/k norms, 4 query heads per key/value
    head), small enough for a test."""
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(config).eval()
    model.requires_grad_(False)
    return model
