"""A preallocated KV cache and a lean decode step for Llama-family models.

The Hugging Face forward pass with a ``DynamicCache`` concatenates every layer's keys and values
on each decoded token (a copy of the whole cache per step) and pays for masks, position logic
and generic dispatch that one-token steps don't need. For the architectures listed in
:data:`ARCHITECTURES` the sampler decodes with :class:`StaticKV` instead:

- the cache is one preallocated tensor per layer, ``[S, H_kv, C, D]`` (``S`` row slots, ``C``
  positions, grown by doubling when a row reaches the end), written in place at each row's own
  position, so rows of different lengths need no left padding;
- one decode step calls the model's own modules (norms, projections with any unmerged LoRA
  adapter, MLP, unembedding), and does the attention itself with
  ``scaled_dot_product_attention`` over each row's valid positions; the arithmetic is that of
  the Hugging Face forward, so sampler and trainer logprobs agree to float rounding;
- finished rows leave the computation at once; their slots are compacted away when fewer than
  three quarters of the slots are live (one copy, amortised).

Prefill still runs the Hugging Face forward over each prompt (:func:`tempering.local.decoding.prefill`)
and its cache is copied into the slots of that prompt's rows.

Shapes: ``S`` slots, ``A`` active rows (``slot_A`` maps rows to slots), ``H`` query heads,
``H_kv`` key/value heads, ``D`` head size, ``C`` cache positions.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from tempering.local.compiled_decode import CompiledLayers
from tempering.local.decoding import cache_kwargs, has_plain_cache

__all__ = ["ARCHITECTURES", "StaticKV", "supports_static_decoding"]

ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
"""``config.model_type`` values decoded with :class:`StaticKV` (decoder layers of the
Llama shape: pre-norm, rotary attention with optional q/k norms, gated MLP)."""

_DISABLE_ENV = "TEMPERING_STATIC_DECODING"
"""``0`` turns the static decoder off (to compare with the Hugging Face forward)."""

COMPACT_BELOW = 0.75
"""Compact the slots when fewer than this fraction of them hold live rows."""


def _inner(model: nn.Module) -> nn.Module:
    unwrap = getattr(model, "get_base_model", None)
    return unwrap() if callable(unwrap) else model  # pyright: ignore[reportReturnType]


def supports_static_decoding(model: nn.Module) -> bool:
    """Whether ``model`` (a causal LM, or a PEFT wrapper of one) decodes with :class:`StaticKV`:
    a listed architecture with full (not sliding-window) attention, and not turned off with
    ``TEMPERING_STATIC_DECODING=0``."""
    if os.environ.get(_DISABLE_ENV, "1") == "0":
        return False
    inner = _inner(model)
    config = getattr(inner, "config", None)
    if not isinstance(inner, PreTrainedModel) or config is None:
        return False
    if getattr(config, "model_type", None) not in ARCHITECTURES:
        return False
    if getattr(config, "use_sliding_window", False) or getattr(config, "sliding_window", None):
        return False
    body = getattr(inner, "model", None)
    layers = getattr(body, "layers", None)
    if not isinstance(layers, nn.ModuleList) or getattr(body, "rotary_emb", None) is None:
        return False
    return has_plain_cache(inner) and all(
        hasattr(layer, "self_attn") and hasattr(layer, "mlp") and hasattr(layer, "input_layernorm")
        for layer in layers
    )


@dataclass(frozen=True)
class PromptCache:
    """Prompts prefilled together: per layer keys and values ``[B, H_kv, P, D]`` (right-padded
    to the longest, ``P``), each prompt's length, its last position's logits ``[B, V]`` (float32)
    and, for the prompts that asked, the logits of every position (``[len, V]``)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor
    last_logits: torch.Tensor
    all_logits: dict[int, torch.Tensor]


def prefill_batch(model: nn.Module, prompts: Sequence[list[int]], all_logits: set[int]) -> PromptCache:
    """Run the prompts through the model in one forward pass, right-padded (a causal model's
    positions before the padding are those of the prompt alone). Only the positions needed are
    unembedded: each prompt's last, and every position of the prompts in ``all_logits``."""
    inner = _inner(model)
    body = _module(inner, "model")
    unembed = getattr(inner, "get_output_embeddings", lambda: None)()
    assert isinstance(unembed, nn.Module)
    device = next(iter(model.parameters())).device
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(p, dtype=torch.long)
    cache = DynamicCache()
    out = body(input_ids=ids.to(device), **cache_kwargs(body, cache), use_cache=True)
    hidden_B_P_H = out.last_hidden_state
    lengths_B = torch.tensor(lengths, device=device)
    last_B_H = hidden_B_P_H[torch.arange(len(prompts), device=device), lengths_B - 1]
    last_logits = unembed(last_B_H).float()
    full = {b: unembed(hidden_B_P_H[b, : lengths[b]]).float() for b in sorted(all_logits)}
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    for layer in cache.layers:
        assert isinstance(layer, DynamicLayer)
        assert layer.keys is not None
        assert layer.values is not None
        keys.append(layer.keys)
        values.append(layer.values)
    return PromptCache(keys, values, lengths_B, last_logits, full)


def _module(owner: object, name: str) -> nn.Module:
    value = getattr(owner, name, None)
    if not isinstance(value, nn.Module):
        raise TypeError(f"{type(owner).__name__}.{name} is not a module; static decoding cannot run")
    return value


@dataclass(frozen=True)
class _Layer:
    """The modules of one decoder layer that a decode step calls (LoRA wrappers included)."""

    input_norm: nn.Module
    q: nn.Module
    k: nn.Module
    v: nn.Module
    o: nn.Module
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    post_norm: nn.Module
    mlp: nn.Module
    scaling: float

    @staticmethod
    def of(layer: nn.Module, head_dim: int) -> _Layer:
        attn = _module(layer, "self_attn")
        q_norm = getattr(attn, "q_norm", None)
        k_norm = getattr(attn, "k_norm", None)
        return _Layer(
            input_norm=_module(layer, "input_layernorm"),
            q=_module(attn, "q_proj"),
            k=_module(attn, "k_proj"),
            v=_module(attn, "v_proj"),
            o=_module(attn, "o_proj"),
            q_norm=q_norm if isinstance(q_norm, nn.Module) else None,
            k_norm=k_norm if isinstance(k_norm, nn.Module) else None,
            post_norm=_module(layer, "post_attention_layernorm"),
            mlp=_module(layer, "mlp"),
            scaling=float(getattr(attn, "scaling", None) or head_dim**-0.5),
        )


class StaticKV:
    """A decoding batch's KV cache in preallocated slots, and the one-token decode step.

    Build it from the prefill caches (one per prompt) and the prompt index of each row; then
    call :meth:`step` with each row's next token, and :meth:`keep` when rows finish.

    Example::

        kv = StaticKV(model, caches, prompt_lengths, rows_N, reserve=max_new)
        logits_A_V = kv.step(next_tokens_A)   # the rows' next-token logits (float32)
        kv.keep(keep_idx)                     # drop finished rows (indices into the active rows)
    """

    def __init__(
        self,
        model: nn.Module,
        prompts: PromptCache,
        rows_N: torch.Tensor,
        *,
        reserve: int,
    ) -> None:
        inner = _inner(model)
        body = _module(inner, "model")
        layers = getattr(body, "layers", None)
        assert isinstance(layers, nn.ModuleList)
        self.embed = _module(body, "embed_tokens")
        self.norm = _module(body, "norm")
        self.rotary = _module(body, "rotary_emb")
        unembed = getattr(inner, "get_output_embeddings", lambda: None)()
        # With PEFT, the unembedding reached through the wrapper carries its adapter.
        assert isinstance(unembed, nn.Module)
        self.unembed: nn.Module = unembed
        config = getattr(inner, "config", None)
        self.num_heads = int(getattr(config, "num_attention_heads", 0))
        hidden = int(getattr(config, "hidden_size", 0))
        self.head_dim = int(getattr(config, "head_dim", None) or hidden // self.num_heads)
        self.layers = [_Layer.of(layer, self.head_dim) for layer in layers]
        self.device, self.dtype = prompts.keys[0].device, prompts.keys[0].dtype
        self.num_kv_heads = int(prompts.keys[0].shape[1])
        self.compiled = CompiledLayers.of(
            self.layers,
            model,
            self.device,
            heads=self.num_heads,
            kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            hidden_act=str(getattr(config, "hidden_act", "")),
        )
        """The layers' compiled step (:mod:`tempering.local.compiled_decode`), or None."""
        self.capacity = int(prompts.lengths.max()) + max(1, min(reserve, 256))
        self.positions = torch.arange(self.capacity, device=self.device)
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._allocate(int(rows_N.shape[0]))
        self.used = 0
        """Slots ``[0, used)`` hold rows (live, or finished and not yet compacted away)."""
        self.length_A = torch.zeros(0, dtype=torch.long, device=self.device)
        """Tokens in each active row's cache (the position the next token takes)."""
        self.slot_A = torch.zeros(0, dtype=torch.long, device=self.device)
        self.prefix = True
        """Whether the active rows are slots ``0 .. A-1`` in order (attention reads a view)."""
        self._place(prompts, rows_N)

    def _allocate(self, slots: int) -> None:
        """Slot buffers ``[slots, H_kv, C, D]`` per layer, keeping what the old ones held."""
        shape = (slots, self.num_kv_heads, self.capacity, self.head_dim)
        for cache in (self.k, self.v):
            for i in range(len(self.layers)):
                grown = torch.zeros(shape, device=self.device, dtype=self.dtype)
                if i < len(cache):
                    kept = min(cache[i].shape[0], slots)
                    grown[:kept] = cache[i][:kept]
                    cache[i] = grown
                else:
                    cache.append(grown)

    def _place(self, prompts: PromptCache, rows_N: torch.Tensor) -> None:
        """Write new rows' prompt keys and values into the slots after ``used`` (row ``n`` gets
        prompt ``rows_N[n]``'s; positions past a prompt's length hold padding, which attention
        never reads: a row attends to positions up to its own)."""
        n = int(rows_N.shape[0])
        if self.used + n > self.k[0].shape[0]:
            self._allocate(max(2 * self.k[0].shape[0], self.used + n))
        width = int(prompts.keys[0].shape[2])
        new = slice(self.used, self.used + n)
        for i, (k_B, v_B) in enumerate(zip(prompts.keys, prompts.values, strict=True)):
            self.k[i][new, :, :width] = k_B.index_select(0, rows_N)
            self.v[i][new, :, :width] = v_B.index_select(0, rows_N)
        self.length_A = torch.cat([self.length_A, prompts.lengths.index_select(0, rows_N)])
        self.slot_A = torch.cat([self.slot_A, torch.arange(self.used, self.used + n, device=self.device)])
        self.used += n

    def add(self, prompts: PromptCache, rows_N: torch.Tensor, *, reserve: int) -> None:
        """Append rows (after the active ones) for prompts prefilled while others decode
        (continuous batching). The slot buffers double when full; the active rows are
        compacted to the front first if finished rows sit between them."""
        needed = int(prompts.lengths.max()) + max(1, min(reserve, 256))
        if needed > self.capacity:
            self._grow(needed)
        if not self.prefix:
            self._compact()
        self._place(prompts, rows_N)

    def _compact(self) -> None:
        """Move the active rows to slots ``0 .. A-1`` (one copy per layer)."""
        A = int(self.slot_A.shape[0])
        for cache in (self.k, self.v):
            for c in cache:
                c[:A] = c.index_select(0, self.slot_A)
        self.slot_A = torch.arange(A, device=self.device)
        self.used = A
        self.prefix = True

    def keep(self, keep_A: torch.Tensor) -> None:
        """Keep only the active rows ``keep_A`` (indices into the current active rows)."""
        self.slot_A = self.slot_A.index_select(0, keep_A)
        self.length_A = self.length_A.index_select(0, keep_A)
        A = int(self.slot_A.shape[0])
        if COMPACT_BELOW * self.used > A:
            self._compact()
        else:
            # Rows that finished at the end leave a prefix; any other gap needs a gather.
            self.prefix = bool(torch.equal(self.slot_A, torch.arange(A, device=self.device)))
            if self.prefix:
                self.used = A

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        for cache in (self.k, self.v):
            for i, c in enumerate(cache):
                grown = c.new_zeros((c.shape[0], c.shape[1], capacity, c.shape[3]))
                grown[:, :, : self.capacity] = c
                cache[i] = grown
        self.capacity = capacity
        self.positions = torch.arange(capacity, device=self.positions.device)

    def step(self, tokens_A: torch.Tensor) -> torch.Tensor:
        """Feed one token per active row; returns the next-token logits ``[A, V]`` (float32)."""
        A = tokens_A.shape[0]
        pos_A = self.length_A
        top = int(pos_A.max()) + 1
        if top > self.capacity:
            self._grow(top)
        if self.dtype != torch.float32:
            # Half-precision batched matmuls copy a key/value view cut short of the capacity
            # into a contiguous buffer (a profile put those copies at 14% of a bfloat16 step);
            # attending over every slot position, the unused ones masked, reads the cache as it is.
            top = self.capacity
        h = self.embed(tokens_A.unsqueeze(1))  # [A, 1, hidden]
        cos, sin = self.rotary(h, pos_A.unsqueeze(1))  # [A, 1, D] each
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [A, 1, 1, D]: broadcast over heads
        # Attend to positions 0..pos (the new token's own included).
        visible_A_C = self.positions[:top].unsqueeze(0) <= pos_A.unsqueeze(1)
        bias_A_1_1_C = torch.zeros((A, 1, 1, top), dtype=torch.float32, device=h.device)
        bias_A_1_1_C.masked_fill_(~visible_A_C.view(A, 1, 1, top), -math.inf)
        slot_A = self.slot_A
        for i, layer in enumerate(self.layers):
            if self.compiled is not None:
                out = self.compiled(
                    i, self.prefix, h, cos, sin, bias_A_1_1_C, self.k[i], self.v[i], slot_A, pos_A, top
                )
                if out is not None:
                    h = out
                    continue
                self.compiled = None  # compilation failed: the module path from here on
            residual = h
            x = layer.input_norm(h)
            q = layer.q(x).view(A, 1, -1, self.head_dim)
            k = layer.k(x).view(A, 1, -1, self.head_dim)
            v = layer.v(x).view(A, 1, -1, self.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q, k = layer.q_norm(q), layer.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [A, H(_kv), 1, D]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k_S, v_S = self.k[i], self.v[i]
            # Write each row's new key/value at its own position.
            k_S[slot_A, :, pos_A] = k[:, :, 0]
            v_S[slot_A, :, pos_A] = v[:, :, 0]
            if self.prefix:
                keys, values = k_S[:A, :, :top], v_S[:A, :, :top]
            else:
                keys = k_S.index_select(0, slot_A)[:, :, :top]
                values = v_S.index_select(0, slot_A)[:, :, :top]
            out = _attend(q, keys, values, bias_A_1_1_C, layer.scaling)  # [A, H, D]
            h = residual + layer.o(out.reshape(A, 1, -1))
            h = h + layer.mlp(layer.post_norm(h))
        self.length_A = pos_A + 1
        logits = self.unembed(self.norm(h))
        return logits[:, -1, :].float()


def _attend(
    q_A_H_1_D: torch.Tensor,
    k_A_K_C_D: torch.Tensor,
    v_A_K_C_D: torch.Tensor,
    bias_A_1_1_C: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per row against its cache: softmax(q k^T * scale + bias) v, the ``G = H / K``
    query heads of each key/value head batched together (grouped-query attention). Scores and
    softmax in float32; returns ``[A, H, D]`` in the cache's dtype."""
    A, H, _, D = q_A_H_1_D.shape
    K = k_A_K_C_D.shape[1]
    q_A_K_G_D = q_A_H_1_D.reshape(A, K, H // K, D)
    scores_A_K_G_C = torch.matmul(q_A_K_G_D, k_A_K_C_D.transpose(2, 3)).float() * scale + bias_A_1_1_C
    weights = torch.softmax(scores_A_K_G_C, dim=-1).to(v_A_K_C_D.dtype)
    return torch.matmul(weights, v_A_K_C_D).reshape(A, H, D)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
