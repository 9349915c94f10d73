"""The per-step sampling math shared by the decode loops (:class:`tempering.local.decoding.Decoder`
and :class:`tempering.local.continuous.ContinuousBatch`): the distribution each row samples from
(temperature, top-k, top-p) and the draw (inverse CDF from one uniform number per row; argmax
for greedy rows). The semantics are in :mod:`tempering.local.sampling`.
"""

from __future__ import annotations

import math

import torch

__all__ = ["draw_inverse_cdf", "draw_tokens", "sampling_logprobs"]


def sampling_logprobs(
    raw_A_V: torch.Tensor,
    temp_A_1: torch.Tensor,
    top_k_A_1: torch.Tensor,
    top_p_A_1: torch.Tensor,
    scale: bool,
    use_top_k: bool,
    use_top_p: bool,
) -> torch.Tensor:
    """Log-probabilities of the distribution each row samples from: logits divided by the
    row's temperature (``scale``; 1 for greedy rows), restricted to its top-k tokens and then to
    its top-p nucleus, renormalised (see :mod:`tempering.local.sampling`). ``top_k`` is the
    vocabulary size and ``top_p`` above 1 where a row sets none."""
    scaled = raw_A_V / temp_A_1 if scale else raw_A_V
    if use_top_k or use_top_p:
        sorted_vals, sorted_idx = scaled.sort(dim=-1, descending=True)
        if use_top_k:
            ranks = torch.arange(scaled.shape[-1], device=scaled.device)
            sorted_vals = sorted_vals.masked_fill(ranks.unsqueeze(0) >= top_k_A_1, -math.inf)
        if use_top_p:
            probs = torch.softmax(sorted_vals, dim=-1)
            before = probs.cumsum(dim=-1) - probs
            sorted_vals = sorted_vals.masked_fill(before >= top_p_A_1, -math.inf)
        scaled = torch.full_like(scaled, -math.inf).scatter(-1, sorted_idx, sorted_vals)
    return torch.log_softmax(scaled, dim=-1)


def draw_tokens(
    raw_A_V: torch.Tensor,
    logp_A_V: torch.Tensor,
    greedy_A: torch.Tensor,
    u_A: torch.Tensor | None,
    any_greedy: bool,
    want_distribution: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Each row's next token, its logprob, and (``want_distribution``) the distribution that
    logprob comes from. Greedy rows take the argmax and report the model's own logprob; the
    others draw by inverse CDF from ``u_A`` (None: every row is greedy)."""
    if u_A is None:
        nxt = raw_A_V.argmax(dim=-1)
    else:
        nxt = draw_inverse_cdf(logp_A_V.exp(), u_A)
        if any_greedy:
            nxt = torch.where(greedy_A, raw_A_V.argmax(dim=-1), nxt)
    token_lp = logp_A_V.gather(1, nxt.unsqueeze(1)).squeeze(1)
    dist: torch.Tensor | None = logp_A_V if want_distribution else None
    if any_greedy:
        model_logp = torch.log_softmax(raw_A_V, dim=-1)
        token_lp = torch.where(greedy_A, model_logp.gather(1, nxt.unsqueeze(1)).squeeze(1), token_lp)
        if dist is not None:
            dist = torch.where(greedy_A.unsqueeze(1), model_logp, logp_A_V)
    return nxt, token_lp, dist


def draw_inverse_cdf(probs_A_V: torch.Tensor, u_A: torch.Tensor) -> torch.Tensor:
    """For each row, the first token whose cumulative probability exceeds ``u * total``
    (``u`` uniform in [0, 1)): a draw from the row's distribution that needs one random number,
    not one per vocabulary entry as ``torch.multinomial`` does. Tokens of probability zero are
    never drawn: the threshold stays below the row's total."""
    cdf_A_V = probs_A_V.cumsum(dim=-1)
    total_A = cdf_A_V[:, -1]
    below_A = torch.nextafter(total_A, torch.zeros_like(total_A))
    threshold_A = torch.minimum(u_A.to(cdf_A_V.dtype) * total_A, below_A)
    return torch.searchsorted(cdf_A_V, threshold_A.unsqueeze(1), right=True).squeeze(1)
