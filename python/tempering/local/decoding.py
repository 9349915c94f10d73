"""Batched decoding with a KV cache: the sampler's model, sampling requests, prefill, cache
merging and the decode loop. The semantics (logprobs, stopping, seeds) are described in
:mod:`tempering.local.sampling`, whose client runs these; the optional top-K and target
logprobs in :mod:`tempering.local.scores`.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import secrets
import uuid
from collections.abc import Sequence
from concurrent.futures import Future as ConcurrentFuture
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tinker
import torch
from tinker import types as ttypes
from torch import nn
from transformers import DynamicCache, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from tempering.local.draws import draw_tokens, sampling_logprobs
from tempering.local.model import LoraDecoding, Placement, adapter_version, decode_copy, lora_decoding
from tempering.local.scores import (
    PromptScores,
    ScoreRequest,
    TopkBuffer,
)

MAX_BATCH_ROWS = 256
"""At most this many sequences decode together when requests are coalesced."""


@functools.cache
def _cache_keyword(model_type: type[nn.Module]) -> str:
    forward = getattr(model_type, "forward", None)
    params = inspect.signature(forward).parameters if forward is not None else {}
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: nn.Module, cache: DynamicCache) -> dict[str, DynamicCache]:
    """The keyword argument that hands ``cache`` to ``model``'s forward.

    transformers 5.24 renamed the forward's ``past_key_values`` to ``cache`` (the old name
    warns until 5.40, and the test suite turns warnings into errors); earlier versions know only
    ``past_key_values``. A PEFT wrapper forwards keywords to the model it wraps, so the wrapped
    model's signature decides."""
    inner = model
    while (unwrap := getattr(inner, "get_base_model", None)) is not None and callable(unwrap):
        nxt = unwrap()
        if not isinstance(nxt, nn.Module) or nxt is inner:
            break
        inner = nxt
    return {_cache_keyword(type(inner)): cache}


@dataclass(frozen=True)
class SamplerModel:
    """Frozen weights to sample from, with what sampling needs to know about them.

    ``model`` is the snapshot as taken (a LoRA snapshot: the shared base with its own adapter).
    Decoding runs :meth:`decode_model`, which applies the adapter as ``lora`` says
    (:func:`tempering.local.model.lora_decoding`): merged into a copy of the adapted weights,
    or cast to the model's dtype. That copy is made on first use and kept while this object
    lives: each live weight version has one, and dropping the sampler returns it.
    """

    model: nn.Module
    base_model: str
    model_dir: Path
    placement: Placement
    tokenizer: PreTrainedTokenizerBase
    vocab_size: int
    max_length: int
    eos_ids: tuple[int, ...]
    lora: LoraDecoding = "as-trained"
    _decode: list[tuple[tuple[int, ...], nn.Module]] = field(
        default_factory=list[tuple[tuple[int, ...], nn.Module]], compare=False, repr=False
    )

    def decode_model(self) -> nn.Module:
        """The weights decoding runs: ``model``, or its decode copy (remade if an adapter
        weight was written in place since, as an ``inflight`` update does)."""
        if self.lora == "as-trained":
            return self.model
        version = adapter_version(self.model)
        if self._decode and self._decode[0][0] == version:
            return self._decode[0][1]
        self._decode.clear()  # the stale copy goes before the new one is made
        with torch.no_grad():
            made = decode_copy(self.model, self.lora)
        self._decode.append((version, made))
        return made

    def has_decode_copy(self) -> bool:
        return bool(self._decode)

    def release_decode_copy(self) -> None:
        """Drop the decode copy (a decode running now keeps its own reference until it ends;
        the next decode makes a new one)."""
        self._decode.clear()

    @staticmethod
    def create(
        model: nn.Module,
        *,
        base_model: str,
        model_dir: Path,
        placement: Placement,
        tokenizer: PreTrainedTokenizerBase,
    ) -> SamplerModel:
        config = getattr(model, "config", None)
        vocab_size = int(getattr(config, "vocab_size", 0) or len(tokenizer))
        max_length = int(getattr(config, "max_position_embeddings", 0) or 1 << 20)
        eos: set[int] = set()
        for source in (getattr(model, "generation_config", None), config):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, list | tuple):
                eos.update(int(v) for v in value)  # pyright: ignore[reportUnknownArgumentType]
        if isinstance(tokenizer.eos_token_id, int):
            eos.add(tokenizer.eos_token_id)
        return SamplerModel(
            model=model,
            base_model=base_model,
            model_dir=model_dir,
            placement=placement,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            max_length=max_length,
            eos_ids=tuple(sorted(eos)),
            lora=lora_decoding(model),
        )


@dataclass
class SampleRequest:
    """One ``sample`` (or ``compute_logprobs``) call, checked and normalised."""

    prompt: list[int]
    num_samples: int
    max_tokens: int
    temperature: float
    top_k: int
    """``0`` for no limit."""
    top_p: float
    stop_ids: tuple[int, ...]
    stop_strings: tuple[str, ...]
    seed: int
    prompt_logprobs: bool
    extras: ScoreRequest = field(default_factory=ScoreRequest)
    """Top-K and target logprobs asked for (:mod:`tempering.local.scores`)."""
    result: ConcurrentFuture[ttypes.SampleResponse] = field(default_factory=ConcurrentFuture)


def make_request(
    sampler: SamplerModel,
    prompt: tinker.ModelInput,
    num_samples: int,
    params: tinker.SamplingParams,
    prompt_logprobs: bool,
    *,
    topk_prompt_logprobs: int = 0,
    topk_sample_logprobs: int = 0,
    target_prompt_logprobs: tinker.TensorData | None = None,
) -> SampleRequest:
    """Check one request against ``sampler`` (``ValueError`` / ``TypeError`` naming the problem)."""
    if not isinstance(prompt, tinker.ModelInput):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"prompt must be a tinker.ModelInput, got {type(prompt).__name__}")
    if not isinstance(params, tinker.SamplingParams):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"sampling_params must be a tinker.SamplingParams, got {type(params).__name__}")
    try:
        tokens = prompt.to_ints()
    except ValueError as exc:
        raise ValueError(f"prompt: only token chunks are supported here ({exc})") from exc
    if not tokens:
        raise ValueError("prompt is empty")
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.min() < 0 or ids.max() >= sampler.vocab_size:
        bad = int(ids.max()) if ids.max() >= sampler.vocab_size else int(ids.min())
        raise ValueError(f"prompt: token id {bad} is outside the vocabulary [0, {sampler.vocab_size})")
    if isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    room = sampler.max_length - len(tokens)
    max_tokens = params.max_tokens if params.max_tokens is not None else room
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    if max_tokens > room:
        raise ValueError(
            f"prompt ({len(tokens)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
            f"context of {sampler.max_length} tokens"
        )
    if not math.isfinite(params.temperature) or params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    stop_ids: tuple[int, ...]
    stop_strings: tuple[str, ...] = ()
    stop = params.stop
    if stop is None:
        stop_ids = sampler.eos_ids
    elif isinstance(stop, str):
        stop_ids, stop_strings = sampler.eos_ids, (stop,)
    else:
        items = list(stop)
        if not items:
            stop_ids = ()
        elif all(isinstance(s, str) for s in items):
            stop_ids, stop_strings = sampler.eos_ids, tuple(str(s) for s in items)
        elif all(isinstance(s, int) and not isinstance(s, bool) for s in items):
            stop_ids = tuple(dict.fromkeys((*(int(s) for s in items), *sampler.eos_ids)))
        else:
            raise ValueError("stop must be strings or token ids, not a mix")
    if any(s == "" for s in stop_strings):
        raise ValueError("stop strings must not be empty")
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    extras = ScoreRequest.checked(
        sampler.vocab_size, len(tokens), topk_prompt_logprobs, topk_sample_logprobs, target_prompt_logprobs
    )
    return SampleRequest(
        prompt=tokens,
        num_samples=num_samples,
        max_tokens=max_tokens,
        temperature=float(params.temperature),
        top_k=params.top_k if params.top_k > 0 else 0,
        top_p=float(params.top_p),
        stop_ids=stop_ids,
        stop_strings=stop_strings,
        seed=seed,
        prompt_logprobs=prompt_logprobs,
        extras=extras,
    )


def prefill(
    model: nn.Module, prompt: list[int], device: torch.device, all_logits: bool
) -> tuple[DynamicCache, torch.Tensor]:
    """Run the prompt through the model. Returns its cache and float32 logits ``[P, V]`` (all
    positions with ``all_logits``, else only the last, ``[1, V]``)."""
    cache = DynamicCache()
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    keep = 0 if all_logits else 1
    out = model(input_ids=ids, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=keep)
    return cache, out.logits[0].float()


def merge_caches(
    caches: Sequence[DynamicCache], lengths: Sequence[int], rows_R: torch.Tensor
) -> DynamicCache:
    """One cache for all rows: each prompt's cache left-padded with zeros to the longest, then
    repeated for its rows (``rows_R`` holds the prompt index of every row)."""
    longest = max(lengths)
    merged = DynamicCache()
    for layer in range(len(caches[0].layers)):
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for cache, length in zip(caches, lengths, strict=True):
            entry = cache.layers[layer]
            assert isinstance(entry, DynamicLayer)
            k, v = entry.keys, entry.values
            assert k is not None
            assert v is not None
            pad = longest - length
            keys.append(nn.functional.pad(k, (0, 0, pad, 0)))
            values.append(nn.functional.pad(v, (0, 0, pad, 0)))
        # keys[r]: [1, H, longest, D] -> [N, H, longest, D]
        merged.update(
            torch.cat(keys).index_select(0, rows_R), torch.cat(values).index_select(0, rows_R), layer
        )
    return merged


def plain_dynamic_cache(cache: DynamicCache) -> bool:
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def has_plain_cache(model: nn.Module) -> bool:
    """Whether the KV cache ``model``'s config builds is the plain dynamic cache (extendable row
    by row; not a sliding-window or hybrid one). A model without a config gets the plain one."""
    return plain_dynamic_cache(DynamicCache(config=getattr(model, "config", None)))


class Decoder:
    """Decodes a batch of requests together. Row ``n`` belongs to request ``req_N[n]``."""

    def __init__(self, sampler: SamplerModel, requests: list[SampleRequest]) -> None:
        self.sampler = sampler
        self.requests = requests

    def run(self) -> list[ttypes.SampleResponse]:
        sampler, requests = self.sampler, self.requests
        model, device = sampler.decode_model(), sampler.placement.device
        caches: list[DynamicCache] = []
        last_logits: list[torch.Tensor] = []
        prompt_parts: list[PromptScores] = []
        for req in requests:
            all_logits = req.prompt_logprobs or req.extras.needs_prompt_logits
            cache, logits = prefill(model, req.prompt, device, all_logits)
            caches.append(cache)
            last_logits.append(logits[-1])
            prompt_parts.append(PromptScores.of(req.prompt, logits, req.prompt_logprobs, req.extras))

        # Only requests with max_tokens > 0 decode (compute_logprobs asks for none).
        decoding = [i for i, r in enumerate(requests) if r.max_tokens > 0]
        live = [requests[i] for i in decoding]
        counts = [r.num_samples for r in live]
        N = sum(counts)
        max_new = max((r.max_tokens for r in live), default=0)
        tokens_N_T = torch.zeros((N, max_new), dtype=torch.long, device=device)
        logprobs_N_T = torch.zeros((N, max_new), dtype=torch.float32, device=device)
        lengths_N = np.zeros(N, dtype=np.int64)
        stopped_N = np.zeros(N, dtype=bool)  # True: stop reason "stop"; else "length"
        width = max((r.extras.topk_sample for r in live), default=0)
        topk = TopkBuffer(N, max_new, width, device) if width else None
        if live:
            req_N = np.repeat(np.arange(len(live)), counts)
            caches_live = [caches[i] for i in decoding]
            logits_live = [last_logits[i] for i in decoding]
            self._decode(
                live, caches_live, logits_live, req_N, tokens_N_T, logprobs_N_T, lengths_N, stopped_N, topk
            )

        tokens_np = tokens_N_T.cpu().numpy()
        logprobs_np = logprobs_N_T.cpu().numpy()
        topk_np = topk.numpy() if topk is not None else None
        responses: list[ttypes.SampleResponse] = []
        row = 0
        for req, scores in zip(requests, prompt_parts, strict=True):
            sequences: list[ttypes.SampledSequence] = []
            batch_id = uuid.uuid4().hex[:12]
            for i in range(req.num_samples):
                n = int(lengths_N[row]) if req.max_tokens > 0 else 0
                k = req.extras.topk_sample
                seq_topk = TopkBuffer.rows(topk_np, row, n, k) if k else None
                sequences.append(
                    ttypes.SampledSequence(
                        stop_reason="stop" if req.max_tokens > 0 and stopped_N[row] else "length",
                        sequence_id=f"local-{batch_id}-{i}",
                        tokens_np=tokens_np[row, :n].astype(np.int32) if n else np.zeros(0, np.int32),
                        logprobs_np=logprobs_np[row, :n].astype(np.float32) if n else np.zeros(0, np.float32),
                        topk_logprobs_np=seq_topk,
                    )
                )
                if req.max_tokens > 0:
                    row += 1
            responses.append(
                ttypes.SampleResponse(
                    sequences=sequences,
                    prompt_logprobs_np=scores.logprobs,
                    topk_prompt_logprobs_np=scores.topk,
                    target_prompt_logprobs=scores.target,
                )
            )
        return responses

    def _decode(
        self,
        requests: list[SampleRequest],
        caches: list[DynamicCache],
        last_logits: list[torch.Tensor],
        req_N: np.ndarray,
        tokens_N_T: torch.Tensor,
        logprobs_N_T: torch.Tensor,
        lengths_N: np.ndarray,
        stopped_N: np.ndarray,
        topk: TopkBuffer | None,
    ) -> None:
        sampler = self.sampler
        model, device = sampler.decode_model(), sampler.placement.device
        R = len(requests)
        N = len(req_N)
        rows_R = torch.from_numpy(req_N).to(device)
        prompt_lengths = [len(r.prompt) for r in requests]
        single = R == 1
        attention: torch.Tensor | None = None
        positions: torch.Tensor | None = None
        if single:
            cache = caches[0]
            cache.batch_repeat_interleave(N)
        else:
            if not all(plain_dynamic_cache(c) for c in caches):
                raise RuntimeError("internal: coalescing needs plain dynamic caches")
            cache = merge_caches(caches, prompt_lengths, rows_R)
            longest = max(prompt_lengths)
            pad_R = torch.tensor([longest - p for p in prompt_lengths], device=device)
            columns = torch.arange(longest, device=device)
            attention = (columns.unsqueeze(0) >= pad_R.unsqueeze(1)).long().index_select(0, rows_R)
            positions = torch.tensor(prompt_lengths, device=device).index_select(0, rows_R)
        logits = torch.stack(last_logits).index_select(0, rows_R)  # [N, V]

        # Per-row parameters, as columns [A, 1] over the active rows A (per request: _R).
        vocab_size = logits.shape[-1]
        temp_R = np.array([r.temperature for r in requests], dtype=np.float32)
        top_k_R = np.array([r.top_k if r.top_k > 0 else vocab_size for r in requests], dtype=np.int64)
        top_p_R = np.array([r.top_p if r.top_p < 1 else 2.0 for r in requests], dtype=np.float32)
        stop_R_S = np.full((R, max(max(len(r.stop_ids) for r in requests), 1)), -1, dtype=np.int64)
        for r, req in enumerate(requests):
            stop_R_S[r, : len(req.stop_ids)] = req.stop_ids

        def rows(values_R: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(values_R[req_N])).to(device)

        greedy_N = rows(temp_R == 0)
        any_greedy, all_greedy = bool((temp_R == 0).any()), bool((temp_R == 0).all())
        uniform_temp = bool((temp_R == temp_R[0]).all())
        temp_col = rows(np.where(temp_R > 0, temp_R, 1.0).astype(np.float32)).unsqueeze(1)
        use_top_k = bool((top_k_R < vocab_size).any())
        top_k_col = rows(top_k_R).unsqueeze(1)
        use_top_p = bool((top_p_R < 1).any())
        top_p_col = rows(top_p_R).unsqueeze(1)
        stop_N_S = rows(stop_R_S)
        max_tokens_N = rows(np.array([r.max_tokens for r in requests], dtype=np.int64))
        windows = [max((len(s) for s in r.stop_strings), default=0) + 4 for r in requests]
        has_strings = any(r.stop_strings for r in requests)
        generators = [torch.Generator(device=device).manual_seed(r.seed) for r in requests]

        active = torch.arange(N, device=device)  # row index of each active row
        active_np = np.arange(N)
        for t in range(tokens_N_T.shape[1]):
            # 1. The distribution each active row samples from.
            raw = logits
            scale = not (uniform_temp and temp_R[0] in (0.0, 1.0))
            logp = sampling_logprobs(raw, temp_col, top_k_col, top_p_col, scale, use_top_k, use_top_p)

            # 2. Draw: one uniform number per row from its request's own generator (over the
            # request's contiguous active rows).
            u_A: torch.Tensor | None = None
            if not all_greedy:
                if single:
                    u_A = torch.rand(len(active_np), generator=generators[0], device=device)
                else:
                    req_A = req_N[active_np]
                    parts: list[torch.Tensor] = []
                    for r, group in itertools.groupby(req_A.tolist()):
                        size = len(list(group))
                        parts.append(torch.rand(size, generator=generators[r], device=device))
                    u_A = torch.cat(parts)
            nxt, token_lp, dist = draw_tokens(raw, logp, greedy_N, u_A, any_greedy, topk is not None)
            tokens_N_T[active, t] = nxt
            logprobs_N_T[active, t] = token_lp
            if topk is not None and dist is not None:
                topk.put(active, t, dist)

            # 3. Which rows stop here.
            hit_stop = (nxt.unsqueeze(1) == stop_N_S).any(dim=1)
            if has_strings:
                hit_stop = hit_stop | self._stop_strings_hit(
                    requests, active_np, t, tokens_N_T, windows, req_N
                )
            at_limit = max_tokens_N <= t + 1
            done = hit_stop | at_limit
            done_np = done.cpu().numpy()
            if done_np.any():
                finished = active_np[done_np]
                lengths_N[finished] = t + 1
                stopped_N[finished] = hit_stop.cpu().numpy()[done_np]
                if done_np.all():
                    return
                keep_np = np.flatnonzero(~done_np)
                keep = torch.from_numpy(keep_np).to(device)
                cache.batch_select_indices(keep)
                active, active_np = active.index_select(0, keep), active_np[keep_np]
                nxt = nxt.index_select(0, keep)
                greedy_N, temp_col = greedy_N.index_select(0, keep), temp_col.index_select(0, keep)
                top_k_col, top_p_col = top_k_col.index_select(0, keep), top_p_col.index_select(0, keep)
                stop_N_S, max_tokens_N = stop_N_S.index_select(0, keep), max_tokens_N.index_select(0, keep)
                if attention is not None and positions is not None:
                    attention, positions = attention.index_select(0, keep), positions.index_select(0, keep)

            # 4. Feed the drawn tokens.
            if attention is not None and positions is not None:
                attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)
                out = model(
                    input_ids=nxt.unsqueeze(1),
                    attention_mask=attention,
                    position_ids=(positions + t).unsqueeze(1),
                    **cache_kwargs(model, cache),
                    use_cache=True,
                )
            else:
                out = model(input_ids=nxt.unsqueeze(1), **cache_kwargs(model, cache), use_cache=True)
            logits = out.logits[:, -1, :].float()

    def _stop_strings_hit(
        self,
        requests: list[SampleRequest],
        active_np: np.ndarray,
        t: int,
        tokens_N_T: torch.Tensor,
        windows: list[int],
        req_N: np.ndarray,
    ) -> torch.Tensor:
        """Whether each active row's text now contains one of its stop strings (checked on the
        last few tokens: a stop string of ``c`` characters spans at most ``c`` tokens)."""
        hit = np.zeros(len(active_np), dtype=bool)
        check = [a for a, n in enumerate(active_np) if requests[req_N[n]].stop_strings]
        if check:
            rows = active_np[check]
            width = max(windows[req_N[n]] for n in rows)
            lo = max(0, t + 1 - width)
            window = tokens_N_T[torch.from_numpy(rows).to(tokens_N_T.device), lo : t + 1].cpu().tolist()
            texts = self.sampler.tokenizer.batch_decode(window)
            for a, n, text in zip(check, rows, texts, strict=True):
                if any(s in text for s in requests[req_N[n]].stop_strings):
                    hit[a] = True
        return torch.from_numpy(hit).to(tokens_N_T.device)
