"""Shared-prefix forward passes for training batches.

An RL batch holds ``G`` samples of every prompt: ``G`` datums whose first tokens (the prompt)
are the same. Running every datum through the model in full repeats the prompt's work ``G``
times. :func:`shared_prefix_hidden` (the decoder body's hidden states, which the training client
unembeds chunk by chunk) and :func:`shared_prefix_logits` run each distinct prefix once, keep its
KV cache, and run only the rest of every datum against its prefix's cache (the cache rows are
gathered per datum, so gradients flow back into the shared prefix). The outputs are those of the
plain forward pass up to float rounding (the matrix shapes differ), and so are the gradients.

:func:`plan_prefix` decides whether it pays: one prefix length ``P`` for the whole batch (the
shortest prefix shared within a run of consecutive datums, and at least one token short of the
shortest datum), used only when it saves at least a quarter of the tokens.

Example::

    plan = plan_prefix(input_ids_B_L.numpy(), lengths_B)
    hidden_B_L_H = shared_prefix_hidden(decoder, input_ids_B_L, attention_B_L, plan) if plan else ...
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from tempering.local.decoding import cache_kwargs, has_plain_cache

__all__ = [
    "PrefixPlan",
    "plan_prefix",
    "shared_prefix_hidden",
    "shared_prefix_logits",
    "supports_prefix_sharing",
]

MIN_SAVING = 0.25
"""Share prefixes only when that removes at least this fraction of the batch's tokens."""

_DISABLE_ENV = "TEMPERING_PREFIX_SHARING"
"""``0`` turns prefix sharing off (to compare with the plain forward pass)."""


def supports_prefix_sharing(model: nn.Module) -> bool:
    """Whether ``model``'s KV cache is the plain dynamic cache that the shared forward pass
    extends row by row (not a sliding-window or hybrid one), and sharing is not turned off
    with ``TEMPERING_PREFIX_SHARING=0``."""
    if os.environ.get(_DISABLE_ENV, "1") == "0":
        return False
    config = getattr(model, "config", None)
    if config is None:
        return False
    return has_plain_cache(model)


@dataclass(frozen=True)
class PrefixPlan:
    """``P`` tokens shared: datum ``b``'s first ``P`` tokens are those of prefix ``group_B[b]``
    (``first_G[g]`` is the first datum of prefix ``g``)."""

    length: int
    group_B: npt.NDArray[np.int64]
    first_G: npt.NDArray[np.int64]


def plan_prefix(input_ids_B_L: npt.NDArray[np.int64], lengths_B: npt.NDArray[np.int64]) -> PrefixPlan | None:
    """The prefix sharing for a batch (right-padded ``input_ids``, real ``lengths``), or None
    when it would save too little. Datums share a prefix when they are consecutive and agree on
    their first ``P`` tokens."""
    B = input_ids_B_L.shape[0]
    if B < 2:
        return None
    # Common-prefix length of each datum with the previous one.
    same_B_L = input_ids_B_L[1:] == input_ids_B_L[:-1]
    lcp = np.where(same_B_L.all(axis=1), input_ids_B_L.shape[1], same_B_L.argmin(axis=1))
    lcp = np.minimum(lcp, np.minimum(lengths_B[1:], lengths_B[:-1]))
    limit = int(lengths_B.min()) - 1
    # Candidate P: the shortest link inside runs that share enough; a link shorter than P
    # starts a new prefix.
    links = lcp[lcp >= 1]
    if limit < 1 or links.size == 0:
        return None
    best: PrefixPlan | None = None
    best_saved = 0
    total = int(lengths_B.sum())
    for candidate in np.unique(np.minimum(links, limit)):
        length = int(candidate)
        starts = np.concatenate([[True], lcp < length])
        groups = int(starts.sum())
        saved = (B - groups) * length
        if saved > best_saved:
            group_B = np.cumsum(starts) - 1
            best = PrefixPlan(length, group_B.astype(np.int64), np.flatnonzero(starts).astype(np.int64))
            best_saved = saved
    if best is None or best_saved < MIN_SAVING * total:
        return None
    return best


def shared_prefix_logits(
    model: nn.Module, input_ids_B_L: torch.Tensor, attention_B_L: torch.Tensor | None, plan: PrefixPlan
) -> torch.Tensor:
    """Logits ``[B, L, V]`` of the batch, each prefix run once (see the module docstring)."""
    return _shared_forward(model, input_ids_B_L, attention_B_L, plan, "logits")


def shared_prefix_hidden(
    decoder: nn.Module, input_ids_B_L: torch.Tensor, attention_B_L: torch.Tensor | None, plan: PrefixPlan
) -> torch.Tensor:
    """The decoder body's last hidden states ``[B, L, H]`` (``decoder``: the model without its
    unembedding, e.g. ``LlamaForCausalLM.model``), each prefix run once. The training client
    turns them into target logprobs chunk by chunk, never holding ``[B, L, V]`` logits."""
    return _shared_forward(decoder, input_ids_B_L, attention_B_L, plan, "last_hidden_state")


def _shared_forward(
    module: nn.Module,
    input_ids_B_L: torch.Tensor,
    attention_B_L: torch.Tensor | None,
    plan: PrefixPlan,
    field: str,
) -> torch.Tensor:
    device = input_ids_B_L.device
    P = plan.length
    first_G = torch.from_numpy(plan.first_G).to(device)
    group_B = torch.from_numpy(plan.group_B).to(device)
    prefix_G_P = input_ids_B_L[:, :P].index_select(0, first_G)
    shared = DynamicCache()
    out = module(input_ids=prefix_G_P, **cache_kwargs(module, shared), use_cache=True)
    cache = DynamicCache()
    for layer, entry in enumerate(shared.layers):
        assert isinstance(entry, DynamicLayer)
        keys, values = entry.keys, entry.values
        assert keys is not None
        assert values is not None
        cache.update(keys.index_select(0, group_B), values.index_select(0, group_B), layer)
    L = input_ids_B_L.shape[1]
    positions = torch.arange(P, L, device=device).unsqueeze(0).expand(input_ids_B_L.shape[0], -1)
    rest = module(
        input_ids=input_ids_B_L[:, P:],
        attention_mask=attention_B_L,
        position_ids=positions,
        **cache_kwargs(module, cache),
        use_cache=True,
    )
    head: torch.Tensor = getattr(out, field)
    tail: torch.Tensor = getattr(rest, field)
    return torch.cat([head.index_select(0, group_B), tail], dim=1)
