"""Micro-batches under a token budget: how the training client splits a request.

``forward``, ``forward_backward`` and ``forward_backward_custom`` split any request into
micro-batches whose padded size (rows x the longest row) is at most the client's token budget,
accumulate the gradients across them, and return the outputs in the request's order. The result
is the unsplit computation's up to float rounding (sums in another order).

The budget (:func:`resolve_token_budget`), first that is set:

1. ``TrainingMemory(max_batch_tokens=...)``, given to ``LocalTrainingClient(memory=...)`` or
   ``ModelLoader(memory=...)``;
2. ``$TEMPERING_MAX_BATCH_TOKENS``;
3. derived from memory and the model's shape (:func:`activation_bytes_per_token`, an estimate of
   the activations a token keeps for the backward pass): on CUDA, half the device's free memory
   when the client is made; on the CPU, a quarter of the machine's physical memory, at most
   :data:`CPU_DEFAULT_TOKENS`.

Rows are grouped to cut padding: datums that share a prefix with the first of their run (an RL
group's samples of one prompt) stay together, so :mod:`tempering.local.prefix` still shares
their prompt inside a micro-batch; runs are ordered by their longest row and rows by length. A
request that fits the budget whole runs as one batch in its own order, as before.

A datum longer than the budget can never fit: :class:`RequestTooLargeError`, before anything
runs (the error names the datum, its length, the limit and the setting that raises it).

Example::

    budget = resolve_token_budget(None, config, placement, checkpointing=False)
    for rows in plan_microbatches([d.tokens for d in checked], budget):
        ...  # pad, forward, backward the datums checked[i] for i in rows
"""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn
from transformers import PretrainedConfig

from tempering.local.errors import LocalEngineError
from tempering.local.model import Placement

__all__ = [
    "CPU_DEFAULT_TOKENS",
    "MAX_BATCH_TOKENS_ENV",
    "RequestTooLargeError",
    "TokenBudget",
    "activation_bytes_per_token",
    "gradients_all_or_nothing",
    "plan_microbatches",
    "resolve_token_budget",
]

MAX_BATCH_TOKENS_ENV = "TEMPERING_MAX_BATCH_TOKENS"
"""The environment variable that sets the token budget of one micro-batch."""

CPU_DEFAULT_TOKENS = 16384
"""The most tokens a derived budget allows on the CPU."""

MIN_DERIVED_TOKENS = 256
"""The least a derived budget allows (the estimate is rough; a set budget may be smaller)."""

_CUDA_FREE_FRACTION = 0.5
_CPU_MEMORY_FRACTION = 0.25

# Values a token keeps per decoder layer for the backward pass, in units of the hidden size and
# of the MLP's intermediate size (Llama-style layer: norms, q/k/v/o projections, attention
# output, gate/up/activation products; the norms keep float32 copies), with room for the
# backward pass's own temporaries and the allocator. Against the bytes saved for backward
# measured with saved-tensor hooks (float32, 128-token rows) the estimate is 1.9x (tiny model)
# to 2.0x (SmolLM2-135M); the 135M model's process grew by 2.5 MiB of peak RSS per token of
# its first micro-batch, against an estimate of 2.55 MiB (docs/benchmarks.md).
# tests/local/test_local_memory.py checks the estimate stays between 1x and 2x the saved bytes.
_PER_HIDDEN = 20
_PER_INTERMEDIATE = 7


class RequestTooLargeError(LocalEngineError, ValueError):
    """A datum longer than one micro-batch may hold: it cannot run under this budget.

    Example::

        try:
            client.forward_backward(data, "cross_entropy").result()
        except RequestTooLargeError as e:
            print(e.index, e.tokens, e.limit)  # 3 9000 8192
    """

    def __init__(self, index: int, tokens: int, limit: int, setting: str) -> None:
        self.index = index
        self.tokens = tokens
        self.limit = limit
        self.setting = setting
        super().__init__(
            f"datum {index} has {tokens} tokens, more than the {limit} tokens one micro-batch may "
            f"hold ({setting}); nothing ran. Raise the budget with {MAX_BATCH_TOKENS_ENV} or "
            "max_batch_tokens=, turn on activation checkpointing "
            "(TEMPERING_ACTIVATION_CHECKPOINTING=1), or shorten the datum"
        )

    def __reduce__(self) -> tuple[type[RequestTooLargeError], tuple[int, int, int, str]]:
        return (type(self), (self.index, self.tokens, self.limit, self.setting))


@dataclass(frozen=True)
class TokenBudget:
    """The most padded tokens (rows x longest row) in one micro-batch, and where that came from."""

    tokens: int
    setting: str


def activation_bytes_per_token(config: PretrainedConfig, dtype: torch.dtype, *, checkpointing: bool) -> int:
    """An estimate of the bytes of activations one token keeps for the backward pass.

    With activation checkpointing, each layer keeps only its input; one layer's activations
    are rebuilt at a time during the backward pass.
    """
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    if hidden <= 0 or layers <= 0:
        raise ValueError(
            f"cannot derive a token budget for model type {getattr(config, 'model_type', '?')!r} "
            f"(no hidden_size/num_hidden_layers in its config): set {MAX_BATCH_TOKENS_ENV}"
        )
    intermediate = int(getattr(config, "intermediate_size", 0) or 4 * hidden)
    size = torch.finfo(dtype).bits // 8
    per_layer = (_PER_HIDDEN * hidden + _PER_INTERMEDIATE * intermediate) * size
    if checkpointing:
        return layers * hidden * size + per_layer
    return layers * per_layer


def resolve_token_budget(
    setting: int | None, config: PretrainedConfig, placement: Placement, *, checkpointing: bool
) -> TokenBudget:
    """The micro-batch token budget (see the module docstring for the order)."""
    if setting is not None:
        return TokenBudget(_positive(setting, "max_batch_tokens"), f"max_batch_tokens={setting}")
    env = os.environ.get(MAX_BATCH_TOKENS_ENV)
    if env:
        try:
            value = int(env)
        except ValueError:
            raise ValueError(f"{MAX_BATCH_TOKENS_ENV}={env!r} is not a whole number of tokens") from None
        return TokenBudget(_positive(value, MAX_BATCH_TOKENS_ENV), f"{MAX_BATCH_TOKENS_ENV}={env}")
    per_token = activation_bytes_per_token(config, placement.dtype, checkpointing=checkpointing)
    if placement.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(placement.device)
        tokens = max(MIN_DERIVED_TOKENS, int(free * _CUDA_FREE_FRACTION / per_token))
        where = f"derived: half of {free / 2**30:.1f} GiB free CUDA memory"
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        tokens = max(
            MIN_DERIVED_TOKENS, min(CPU_DEFAULT_TOKENS, int(total * _CPU_MEMORY_FRACTION / per_token))
        )
        where = (
            f"derived: the CPU default, at most {CPU_DEFAULT_TOKENS} and a quarter of {total / 2**30:.1f} GiB"
        )
    return TokenBudget(tokens, f"{where} at {per_token / 2**10:.0f} KiB of activations per token")


def _positive(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"{name} must be a whole number of tokens >= 1, got {value!r}")
    return value


def plan_microbatches(tokens_D: Sequence[npt.NDArray[np.int64]], budget: TokenBudget) -> list[list[int]]:
    """The request's datums (by index) in micro-batches of at most ``budget.tokens`` padded
    tokens each. Raises :class:`RequestTooLargeError` for a datum longer than the budget."""
    lengths = [len(t) for t in tokens_D]
    for index, n in enumerate(lengths):
        if n > budget.tokens:
            raise RequestTooLargeError(index, n, budget.tokens, budget.setting)
    if len(lengths) * max(lengths) <= budget.tokens:
        return [list(range(len(lengths)))]
    run_D = _prefix_runs(tokens_D)
    run_longest: dict[int, int] = {}
    for run, n in zip(run_D, lengths, strict=True):
        run_longest[run] = max(run_longest.get(run, 0), n)
    order = sorted(range(len(lengths)), key=lambda i: (run_longest[run_D[i]], run_D[i], lengths[i]))
    parts: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        n = lengths[i]
        if current and (len(current) + 1) * max(longest, n) > budget.tokens:
            parts.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    parts.append(current)
    return parts


def _prefix_runs(tokens_D: Sequence[npt.NDArray[np.int64]]) -> list[int]:
    """Run number of each datum: consecutive datums stay in the run of the first one with whom
    they share at least a quarter of the shorter's tokens."""
    runs: list[int] = []
    first = 0
    for i, tokens in enumerate(tokens_D):
        if i > 0:
            head = tokens_D[first]
            m = min(len(head), len(tokens))
            same = head[:m] == tokens[:m]
            shared = m if bool(same.all()) else int(same.argmin())
            if shared < 1 or 4 * shared < m:
                first = i
        runs.append(first)
    return runs


@contextmanager
def gradients_all_or_nothing(params: Mapping[str, nn.Parameter]) -> Generator[None]:
    """Accumulate a request's gradients apart from the earlier ones and add them only if the
    whole request (every micro-batch) succeeds: a failed request changes no gradient."""
    earlier = {name: p.grad for name, p in params.items()}
    for p in params.values():
        p.grad = None
    try:
        yield
    except BaseException:
        for name, p in params.items():
            p.grad = earlier[name]
        raise
    for name, p in params.items():
        before = earlier[name]
        if before is not None:
            p.grad = before if p.grad is None else before.add_(p.grad)
