"""Target logprobs of a training batch without ``[B, T, V]`` logits.

The training client runs the decoder body (the model without its unembedding) to hidden states
and applies the unembedding (the output-embedding module as ``peft`` wrapped it, so a LoRA
adapter on it counts) to chunks of tokens, keeping per token only the log-sum-exp and the target
logits. Each chunk runs under ``torch.utils.checkpoint``: its logits are freed after the forward
pass and rebuilt one chunk at a time in the backward pass. Padding positions are not unembedded.

At construction :class:`TrainingForward` checks on a few tokens that the model's logits are
exactly its unembedding of the decoder's output (true of Llama-style models; not of models that
scale or soft-cap their logits), and otherwise falls back to the model's own logits.

With ``activation_checkpointing``, the decoder layers run under ``torch.utils.checkpoint`` too
(each keeps only its input for the backward pass and is recomputed there). The KV cache that
prefix sharing (:mod:`tempering.local.prefix`) extends cannot be rebuilt twice, so prefix sharing
is off while checkpointing is on.

Example::

    forward = TrainingForward(model, activation_checkpointing=False)
    lp_B_L_K = forward.target_logprobs(batch)   # as log_softmax(model(...).logits).gather(targets)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Generator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_layers import GradientCheckpointingLayer

from tempering.local.losses import Batch
from tempering.local.model import hf_model
from tempering.local.prefix import (
    PrefixPlan,
    plan_prefix,
    shared_prefix_hidden,
    shared_prefix_logits,
    supports_prefix_sharing,
)

__all__ = [
    "CHECKPOINTING_ENV",
    "LOGITS_CHUNK_ELEMENTS",
    "TrainingForward",
    "chunked_target_logprobs",
    "per_datum_logprobs",
    "resolve_checkpointing",
]

CHECKPOINTING_ENV = "TEMPERING_ACTIVATION_CHECKPOINTING"
"""``1`` turns activation checkpointing on where the client's constructor does not say."""

LOGITS_CHUNK_ELEMENTS = 1 << 22
"""Logits per chunk (tokens x vocabulary): 16 MiB of float32."""


def resolve_checkpointing(setting: bool | None) -> bool:
    """The argument, else ``$TEMPERING_ACTIVATION_CHECKPOINTING`` (``1``/``0``), else off."""
    if setting is not None:
        return setting
    env = os.environ.get(CHECKPOINTING_ENV, "0")
    if env not in ("0", "1"):
        raise ValueError(f"{CHECKPOINTING_ENV} must be 0 or 1, got {env!r}")
    return env == "1"


def _chunk_logprobs(unembed: nn.Module, hidden_N_H: torch.Tensor, targets_N_K: torch.Tensor) -> torch.Tensor:
    logits_N_V = unembed(hidden_N_H).float()
    lse_N_1 = torch.logsumexp(logits_N_V, dim=-1, keepdim=True)
    return logits_N_V.gather(-1, targets_N_K) - lse_N_1


def chunked_target_logprobs(
    unembed: nn.Module, hidden_N_H: torch.Tensor, targets_N_K: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """``lp[n, k] = log_softmax(unembed(hidden[n]))[targets[n, k]]`` in float32, ``chunk_tokens``
    tokens at a time; with gradients on, each chunk's logits are rebuilt in the backward pass
    instead of kept."""
    run = functools.partial(_chunk_logprobs, unembed)
    out: list[torch.Tensor] = []
    for start in range(0, hidden_N_H.shape[0], chunk_tokens):
        h, t = hidden_N_H[start : start + chunk_tokens], targets_N_K[start : start + chunk_tokens]
        if torch.is_grad_enabled():
            lp = checkpoint(run, h, t, use_reentrant=False)
            assert isinstance(lp, torch.Tensor)
            out.append(lp)
        else:
            out.append(run(h, t))
    return torch.cat(out) if len(out) > 1 else out[0]


class TrainingForward:
    """Target logprobs of padded batches for one model (see the module docstring)."""

    def __init__(self, model: nn.Module, *, activation_checkpointing: bool) -> None:
        base = hf_model(model)
        self._model = model
        decoder = base.get_decoder()
        unembed = base.get_output_embeddings()
        if not isinstance(decoder, nn.Module) or not isinstance(unembed, nn.Module):
            raise TypeError(f"{type(base).__name__} has no decoder body and output embedding to split")
        self._decoder: nn.Module = decoder
        self._unembed: nn.Module = unembed
        self.activation_checkpointing = activation_checkpointing
        self.share_prefixes = supports_prefix_sharing(base) and not activation_checkpointing
        self._layers = [m for m in decoder.modules() if isinstance(m, GradientCheckpointingLayer)]
        if activation_checkpointing and not self._layers:
            raise ValueError(
                f"activation checkpointing: {type(base).__name__} has no decoder layers the engine "
                f"can checkpoint; turn it off ({CHECKPOINTING_ENV}=0)"
            )
        self.chunk_tokens = max(1, LOGITS_CHUNK_ELEMENTS // int(base.config.vocab_size))
        self.split_head = self._head_is_plain_unembedding()

    def _head_is_plain_unembedding(self) -> bool:
        """Whether the model's logits are its unembedding of the decoder's last hidden state."""
        device = next(self._model.parameters()).device
        ids = torch.arange(1, 5, device=device).unsqueeze(0)
        with torch.no_grad():
            whole = self._model(input_ids=ids, use_cache=False).logits
            split = self._unembed(self._decoder(input_ids=ids, use_cache=False).last_hidden_state)
        return whole.shape == split.shape and torch.equal(whole, split)

    @contextmanager
    def _checkpointed_layers(self) -> Generator[None]:
        """Run every decoder layer under ``torch.utils.checkpoint`` (with gradients on)."""
        if not (self.activation_checkpointing and torch.is_grad_enabled()):
            yield
            return
        for layer in self._layers:
            object.__setattr__(layer, "forward", _checkpointed(layer.forward))
        try:
            yield
        finally:
            for layer in self._layers:
                object.__delattr__(layer, "forward")

    def target_logprobs(self, batch: Batch, needs_grad_B_L: torch.Tensor | None = None) -> torch.Tensor:
        """``lp[b, t, k]``: log-probability of ``targets[b, t, k]`` after ``input_ids[b, :t+1]``
        (0 at padding). Datums that share their first tokens share that part of the forward
        pass (:mod:`tempering.local.prefix`).

        ``needs_grad_B_L`` (with gradients on): the positions whose logprobs the loss takes a
        gradient from. The others are unembedded without a backward pass (their values are the
        same); on a chat SFT batch, where only the answers are trained, that saves most of the
        unembedding's backward, the largest matrix of a small model."""
        ids, mask = batch.input_ids, batch.attention_mask
        plan = None
        if self.share_prefixes:
            lengths = mask.sum(dim=1).cpu().numpy() if mask is not None else np.full(len(ids), ids.shape[1])
            plan = plan_prefix(ids.cpu().numpy(), lengths.astype(np.int64))
        with self._checkpointed_layers():
            if not self.split_head:
                return self._from_model_logits(batch, plan)
            if plan is not None:
                hidden_B_L_H = shared_prefix_hidden(self._decoder, ids, mask, plan)
            else:
                out = self._decoder(input_ids=ids, attention_mask=mask, use_cache=False)
                hidden_B_L_H = out.last_hidden_state
        B, L, K = batch.targets.shape
        real_B_L = (
            mask.bool() if mask is not None else torch.ones((B, L), dtype=torch.bool, device=ids.device)
        )
        if needs_grad_B_L is not None and torch.is_grad_enabled():
            with_grad_B_L = needs_grad_B_L & real_B_L
            if bool(with_grad_B_L.any()) and not bool(torch.equal(with_grad_B_L, real_B_L)):
                lp_B_L_K = self._positions_logprobs(
                    hidden_B_L_H, batch.targets, real_B_L & ~with_grad_B_L, grad=False
                )
                return lp_B_L_K + self._positions_logprobs(
                    hidden_B_L_H, batch.targets, with_grad_B_L, grad=True
                )
        if mask is None:
            lp_N_K = chunked_target_logprobs(
                self._unembed,
                hidden_B_L_H.reshape(B * L, -1),
                batch.targets.reshape(B * L, K),
                self.chunk_tokens,
            )
            return lp_N_K.reshape(B, L, K)
        return self._positions_logprobs(hidden_B_L_H, batch.targets, real_B_L, grad=True)

    def _positions_logprobs(
        self, hidden_B_L_H: torch.Tensor, targets_B_L_K: torch.Tensor, at_B_L: torch.Tensor, *, grad: bool
    ) -> torch.Tensor:
        """Target logprobs at the positions ``at_B_L``, 0 elsewhere; without a graph unless ``grad``."""
        rows, cols = at_B_L.nonzero(as_tuple=True)
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            lp_N_K = chunked_target_logprobs(
                self._unembed, hidden_B_L_H[rows, cols], targets_B_L_K[rows, cols], self.chunk_tokens
            )
        return lp_N_K.new_zeros(targets_B_L_K.shape).index_put((rows, cols), lp_N_K)

    def _from_model_logits(self, batch: Batch, plan: PrefixPlan | None) -> torch.Tensor:
        """The fallback for models whose logits are not a plain unembedding: their own logits."""
        if plan is not None:
            logits = shared_prefix_logits(self._model, batch.input_ids, batch.attention_mask, plan)
        else:
            logits = self._model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logits_B_L_V = logits.float()
        lse_B_L_1 = torch.logsumexp(logits_B_L_V, dim=-1, keepdim=True)
        return logits_B_L_V.gather(-1, batch.targets) - lse_B_L_1


def per_datum_logprobs(lp_B_L_K: torch.Tensor, batch: Batch) -> list[torch.Tensor]:
    """Each datum's logprobs in the shape of its ``target_tokens``."""
    out: list[torch.Tensor] = []
    for b, shape in enumerate(batch.target_shapes):
        T = shape[0]
        out.append(lp_B_L_K[b, :T, 0] if len(shape) == 1 else lp_B_L_K[b, :T, : shape[1]])
    return out


def _checkpointed(forward: Callable[..., object]) -> Callable[..., object]:
    def run(*args: object, **kwargs: object) -> object:
        # Keyword tensors (the rotary embeddings) are closed over; non-reentrant checkpointing
        # keeps what the recomputation needs either way.
        return checkpoint(functools.partial(forward, **kwargs), *args, use_reentrant=False)

    return run
