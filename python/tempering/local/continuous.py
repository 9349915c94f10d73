"""Continuous batching: requests join a batch that is already decoding.

With static decoding (:mod:`tempering.local.fastdecode`), a request that arrives while others
decode does not wait for the whole batch to finish: between two decode steps it is prefilled,
its rows are appended to the running batch (their own cache slots and positions), and they
decode with everyone else's. Each request is answered as soon as its own rows stop, not when
the batch ends.

What a request gets does not depend on what it ran with: it draws from its own generator, one
uniform number per row of its own per step, and its logprobs are those of the same
computation (float rounding in a different batch shape aside), exactly as in
:class:`tempering.local.decoding.Decoder`, which still decodes models that static decoding does
not cover. The semantics are in :mod:`tempering.local.sampling`.

Shapes: ``A`` active rows (rows of one request are contiguous, in admission order), ``V``
vocabulary, ``S`` stop ids per row (padded with -1).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np
import torch
from tinker import types as ttypes
from tinker.types.topk_logprobs import TopkLogprobs

from tempering.local.decoding import (
    MAX_BATCH_ROWS,
    SampleRequest,
    SamplerModel,
)
from tempering.local.draws import draw_tokens, sampling_logprobs
from tempering.local.fastdecode import StaticKV, prefill_batch
from tempering.local.scores import PromptScores, topk_of

__all__ = ["ContinuousBatch", "length_groups"]


PADDING_WASTE = 0.25
"""Prompts prefilled together pad to the longest; a group's padding stays under this share."""


def length_groups(lengths: list[int]) -> list[list[int]]:
    """Indices of prompts to prefill together: sorted by length, a group closes when padding
    to its longest would waste more than :data:`PADDING_WASTE` of its tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i in order:
        longest = lengths[i]  # sorted: the newest is the longest
        if current and longest * (len(current) + 1) > (1 + PADDING_WASTE) * (total + lengths[i]):
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += lengths[i]
    if current:
        groups.append(current)
    return groups


@dataclass(eq=False)
class _Live:
    """A request being decoded: its generator and what its rows have produced so far."""

    request: SampleRequest
    scores: PromptScores
    generator: torch.Generator
    tokens: list[list[int]]
    logprobs: list[list[float]]
    topk_ids: list[list[np.ndarray]]
    topk_lps: list[list[np.ndarray]]
    stopped: list[bool]
    open_rows: int
    window: int
    """Tokens of text checked for stop strings (a stop string of ``c`` characters spans at
    most ``c`` tokens)."""


@dataclass
class _Rows:
    """Per-row sampling settings of the active rows, as columns."""

    greedy: torch.Tensor  # [A] bool
    temp: torch.Tensor  # [A, 1]: 1 for greedy rows
    top_k: torch.Tensor  # [A, 1]: V where unset
    top_p: torch.Tensor  # [A, 1]: 2 where unset
    stop: torch.Tensor  # [A, S]
    max_tokens: torch.Tensor  # [A]
    made: torch.Tensor  # [A]: tokens drawn so far
    owner: list[_Live] = field(default_factory=list[_Live])
    sample: list[int] = field(default_factory=list[int])
    """Each row's request and its index among that request's samples."""

    def select(self, keep: torch.Tensor, keep_np: np.ndarray) -> _Rows:
        def pick(t: torch.Tensor) -> torch.Tensor:
            return t.index_select(0, keep)

        return _Rows(
            pick(self.greedy),
            pick(self.temp),
            pick(self.top_k),
            pick(self.top_p),
            pick(self.stop),
            pick(self.max_tokens),
            pick(self.made),
            [self.owner[i] for i in keep_np],
            [self.sample[i] for i in keep_np],
        )

    def extend(self, other: _Rows) -> _Rows:
        width = max(self.stop.shape[1], other.stop.shape[1])

        def pad(stop: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(stop, (0, width - stop.shape[1]), value=-1)

        return _Rows(
            torch.cat([self.greedy, other.greedy]),
            torch.cat([self.temp, other.temp]),
            torch.cat([self.top_k, other.top_k]),
            torch.cat([self.top_p, other.top_p]),
            torch.cat([pad(self.stop), pad(other.stop)]),
            torch.cat([self.max_tokens, other.max_tokens]),
            torch.cat([self.made, other.made]),
            self.owner + other.owner,
            self.sample + other.sample,
        )


class ContinuousBatch:
    """The rows decoding now; :meth:`admit` adds requests, :meth:`step` decodes one token.

    Example::

        batch = ContinuousBatch(sampler)
        batch.admit(requests)            # prefill; max_tokens=0 requests are answered here
        while batch.rows:
            batch.step()                 # requests are answered as their rows stop
            batch.admit(newly_arrived)   # between steps
    """

    def __init__(self, sampler: SamplerModel) -> None:
        self.sampler = sampler
        self.device = sampler.placement.device
        self.kv: StaticKV | None = None
        self.logits: torch.Tensor | None = None  # [A, V]: each active row's next-token logits
        self.state: _Rows | None = None

    @property
    def rows(self) -> int:
        return 0 if self.state is None else len(self.state.owner)

    def room(self) -> int:
        """Rows that can still join (at most ``MAX_BATCH_ROWS`` decode together)."""
        return MAX_BATCH_ROWS - self.rows

    # ---- admission ------------------------------------------------------------------------------

    def admit(self, requests: list[SampleRequest]) -> None:
        """Prefill ``requests`` and append their rows (a request whose result was cancelled is
        skipped; one with ``max_tokens=0`` is answered at once). Prompts are prefilled
        together, in groups of similar length (:func:`length_groups`)."""
        live = [r for r in requests if r.result.set_running_or_notify_cancel()]
        for group in length_groups([len(r.prompt) for r in live]):
            self._admit_group([live[i] for i in group])

    def _admit_group(self, requests: list[SampleRequest]) -> None:
        sampler, device = self.sampler, self.device
        wants_all = {i for i, r in enumerate(requests) if r.prompt_logprobs or r.extras.needs_prompt_logits}
        try:
            prompts = prefill_batch(sampler.decode_model(), [r.prompt for r in requests], wants_all)
        except Exception as exc:
            for r in requests:
                r.result.set_exception(exc)
            return
        joined: list[_Live] = []
        counts: list[int] = []
        kept: list[int] = []
        for b, req in enumerate(requests):
            try:
                logits = prompts.all_logits.get(b, prompts.last_logits[b : b + 1])
                scores = PromptScores.of(req.prompt, logits, req.prompt_logprobs, req.extras)
            except Exception as exc:
                req.result.set_exception(exc)
                continue
            n = req.num_samples
            live = _Live(
                request=req,
                scores=scores,
                generator=torch.Generator().manual_seed(req.seed),
                tokens=[[] for _ in range(n)],
                logprobs=[[] for _ in range(n)],
                topk_ids=[[] for _ in range(n)],
                topk_lps=[[] for _ in range(n)],
                stopped=[False] * n,
                open_rows=n,
                window=max((len(s) for s in req.stop_strings), default=0) + 4,
            )
            if req.max_tokens == 0:
                self._answer(live)
                continue
            joined.append(live)
            counts.append(n)
            kept.append(b)
        if not joined:
            return
        prompt_N = torch.repeat_interleave(torch.tensor(kept), torch.tensor(counts)).to(device)
        reserve = max(live.request.max_tokens for live in joined)
        if self.kv is None:
            self.kv = StaticKV(sampler.decode_model(), prompts, prompt_N, reserve=reserve)
        else:
            self.kv.add(prompts, prompt_N, reserve=reserve)
        logits = prompts.last_logits.index_select(0, prompt_N)
        self.logits = logits if self.logits is None else torch.cat([self.logits, logits])
        new = self._rows(joined, counts, int(logits.shape[-1]))
        self.state = new if self.state is None else self.state.extend(new)

    def _rows(self, joined: list[_Live], counts: list[int], vocab_size: int) -> _Rows:
        device = self.device
        reqs = [live.request for live in joined]

        def column(values: list[float] | list[int] | list[bool], dtype: torch.dtype) -> torch.Tensor:
            return torch.repeat_interleave(
                torch.tensor(values, dtype=dtype, device=device), torch.tensor(counts, device=device)
            )

        width = max(max((len(r.stop_ids) for r in reqs), default=0), 1)
        stop = torch.full((len(reqs), width), -1, dtype=torch.long, device=device)
        for i, r in enumerate(reqs):
            if r.stop_ids:
                stop[i, : len(r.stop_ids)] = torch.tensor(r.stop_ids, device=device)
        return _Rows(
            greedy=column([r.temperature == 0 for r in reqs], torch.bool),
            temp=column([r.temperature if r.temperature > 0 else 1.0 for r in reqs], torch.float32).unsqueeze(
                1
            ),
            top_k=column([r.top_k if r.top_k > 0 else vocab_size for r in reqs], torch.long).unsqueeze(1),
            top_p=column([r.top_p if r.top_p < 1 else 2.0 for r in reqs], torch.float32).unsqueeze(1),
            stop=torch.repeat_interleave(stop, torch.tensor(counts, device=device), dim=0),
            max_tokens=column([r.max_tokens for r in reqs], torch.long),
            made=torch.zeros(sum(counts), dtype=torch.long, device=device),
            owner=[live for live, n in zip(joined, counts, strict=True) for _ in range(n)],
            sample=[i for n in counts for i in range(n)],
        )

    # ---- one decode step ------------------------------------------------------------------------

    def step(self) -> None:
        """Draw one token for every active row, answer the requests whose rows all stopped,
        and feed the others' tokens to the model."""
        state, raw, kv = self.state, self.logits, self.kv
        assert state is not None
        assert raw is not None
        assert kv is not None
        # What the rows ask for, read from their requests (no device round trip).
        reqs = [live.request for live in dict.fromkeys(state.owner)]
        vocab_size = raw.shape[-1]
        scale = any(r.temperature not in (0.0, 1.0) for r in reqs)
        use_top_k = any(0 < r.top_k < vocab_size for r in reqs)
        use_top_p = any(r.top_p < 1 for r in reqs)
        any_greedy = any(r.temperature == 0 for r in reqs)
        logp = sampling_logprobs(raw, state.temp, state.top_k, state.top_p, scale, use_top_k, use_top_p)
        u_A: torch.Tensor | None = None
        if not all(r.temperature == 0 for r in reqs):
            # Each request's contiguous rows draw from its own (CPU) generator; one copy over.
            parts: list[torch.Tensor] = []
            start = 0
            while start < len(state.owner):
                owner, end = state.owner[start], start
                while end < len(state.owner) and state.owner[end] is owner:
                    end += 1
                parts.append(torch.rand(end - start, generator=owner.generator))
                start = end
            u_A = torch.cat(parts).to(self.device, non_blocking=True)
        width = max(r.extras.topk_sample for r in reqs)
        nxt, token_lp, dist = draw_tokens(raw, logp, state.greedy, u_A, any_greedy, width > 0)
        state.made = state.made + 1

        hit_stop = (nxt.unsqueeze(1) == state.stop).any(dim=1)
        at_limit = state.made >= state.max_tokens
        # One transfer to the host per step: tokens, stop flags and logprobs.
        host = (
            torch.stack([nxt.double(), hit_stop.double(), at_limit.double(), token_lp.double()]).cpu().numpy()
        )
        tokens_A, lps_A = host[0].astype(np.int64).tolist(), host[3].tolist()
        stop_np = host[1] > 0
        done_np = stop_np | (host[2] > 0)
        topk = None
        if dist is not None:
            ids, lps = topk_of(dist, width)
            topk = ids.cpu().numpy(), lps.cpu().numpy()
        for a, (live, i) in enumerate(zip(state.owner, state.sample, strict=True)):
            live.tokens[i].append(int(tokens_A[a]))
            live.logprobs[i].append(float(lps_A[a]))
            k = live.request.extras.topk_sample
            if topk is not None and k:
                live.topk_ids[i].append(topk[0][a, :k])
                live.topk_lps[i].append(topk[1][a, :k])
            if not stop_np[a] and live.request.stop_strings and self._stop_string_hit(live, i):
                stop_np[a] = done_np[a] = True
        if done_np.any():
            for a in np.flatnonzero(done_np):
                live, i = state.owner[a], state.sample[a]
                live.stopped[i] = bool(stop_np[a])
                live.open_rows -= 1
                if live.open_rows == 0:
                    self._answer(live)
            keep_np = np.flatnonzero(~done_np)
            if len(keep_np) == 0:
                self.kv, self.logits, self.state = None, None, None
                return
            keep = torch.from_numpy(keep_np).to(self.device)
            kv.keep(keep)
            nxt = nxt.index_select(0, keep)
            self.state = state.select(keep, keep_np)
        self.logits = kv.step(nxt)

    def _stop_string_hit(self, live: _Live, i: int) -> bool:
        text = self.sampler.tokenizer.decode(live.tokens[i][-live.window :])
        return any(s in text for s in live.request.stop_strings)

    def fail(self, exc: BaseException) -> None:
        """Fail every request still decoding (after an error in a step) and empty the batch."""
        if self.state is not None:
            for live in dict.fromkeys(self.state.owner):
                if not live.request.result.done():
                    live.request.result.set_exception(exc)
        self.kv, self.logits, self.state = None, None, None

    # ---- answers --------------------------------------------------------------------------------

    @staticmethod
    def _answer(live: _Live) -> None:
        req = live.request
        batch_id = uuid.uuid4().hex[:12]
        k = req.extras.topk_sample
        sequences: list[ttypes.SampledSequence] = []
        for i in range(req.num_samples):
            n = len(live.tokens[i])
            topk = None
            if k:
                topk = TopkLogprobs(
                    token_ids=np.stack(live.topk_ids[i]) if n else np.zeros((0, k), np.int32),
                    logprobs=np.stack(live.topk_lps[i]) if n else np.zeros((0, k), np.float32),
                )
            sequences.append(
                ttypes.SampledSequence(
                    stop_reason="stop" if live.stopped[i] else "length",
                    sequence_id=f"local-{batch_id}-{i}",
                    tokens_np=np.asarray(live.tokens[i], dtype=np.int32),
                    logprobs_np=np.asarray(live.logprobs[i], dtype=np.float32),
                    topk_logprobs_np=topk,
                )
            )
        scores = live.scores
        req.result.set_result(
            ttypes.SampleResponse(
                sequences=sequences,
                prompt_logprobs_np=scores.logprobs,
                topk_prompt_logprobs_np=scores.topk,
                target_prompt_logprobs=scores.target,
            )
        )
