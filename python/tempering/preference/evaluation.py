"""Held-out evaluation on labeled comparisons: the policy's log-probability of each pair's
chosen and rejected completion, and the chosen answers as reference replies.

Shapes: ``P`` pairs; ``D = 2 P`` datums (chosen at even ``d``, rejected at odd).

Example::

    chosen_P, rejected_P = await pair_logprobs(sampler, renderer, test_pairs)
    ReplyEvaluator(chosen_answers(test_pairs), renderer)    # tempering.evals.reply
    figures, ci95 = dpo_pair_figures(before, after, beta=0.1)    # before/after: pair_logprobs
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tempering.evals.stats import wilson_interval
from tempering.preference.data import pair_datums
from tempering.preference.dpo import reference_logprobs
from tempering_protocols import LabeledComparison, Message, Renderer, SamplingClient

__all__ = ["chosen_answers", "chosen_reply", "dpo_pair_figures", "pair_logprobs"]

PairLogprobs = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
"""``(chosen_P, rejected_P)`` of :func:`pair_logprobs`."""


async def pair_logprobs(
    sampler: SamplingClient, renderer: Renderer, pairs: Sequence[LabeledComparison]
) -> PairLogprobs:
    """``(chosen_P, rejected_P)``: the sampler's log-probability of each pair's chosen and
    rejected completion given its prompt, summed over the completion's tokens (ties left out).

    Example::

        chosen_P, rejected_P = await pair_logprobs(sampler, renderer, pairs)
        float(np.mean(chosen_P > rejected_P))     # the policy's preference accuracy
    """
    data_D = pair_datums(renderer, pairs)
    futures = reference_logprobs(sampler, data_D)
    lp_D = np.zeros(len(data_D))
    for d, (datum, future) in enumerate(zip(data_D, futures, strict=True)):
        logprobs_T = np.asarray([0.0 if x is None else x for x in (await future)[1:]], dtype=np.float64)
        weights_T = datum.loss_fn_inputs["weights"].to_numpy().astype(np.float64)
        lp_D[d] = float(logprobs_T @ weights_T)
    return lp_D[0::2], lp_D[1::2]


def dpo_pair_figures(
    before: PairLogprobs, after: PairLogprobs, *, beta: float
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """The held-out figures of a DPO run from :func:`pair_logprobs` of the reference (``before``)
    and of the trained policy (``after``) on the same pairs, and the 95% Wilson intervals of its
    accuracies: ``preference_accuracy_before``/``_after`` (``log π(chosen) > log π(rejected)``),
    ``logprob_margin_before``/``_after`` (mean ``log π(chosen) - log π(rejected)``),
    ``reward_accuracy`` (pairs whose implicit reward ``β log(π/π_ref)`` ranks the chosen
    completion higher, ties half) and ``reward_margin`` (mean ``β Δ``).

    Example::

        before = await pair_logprobs(reference_sampler, renderer, pairs)
        figures, ci95 = dpo_pair_figures(before, await pair_logprobs(sampler, renderer, pairs), beta=0.1)
    """
    (chosen_0, rejected_0), (chosen_1, rejected_1) = before, after
    delta_P = (chosen_1 - chosen_0) - (rejected_1 - rejected_0)
    right_P = np.where(np.abs(delta_P) < 1e-4, 0.5, (delta_P > 0).astype(np.float64))
    pref_0, pref_1 = np.mean(chosen_0 > rejected_0), np.mean(chosen_1 > rejected_1)
    n = len(chosen_0)
    figures = {
        "preference_accuracy_before": float(pref_0),
        "preference_accuracy_after": float(pref_1),
        "logprob_margin_before": float(np.mean(chosen_0 - rejected_0)),
        "logprob_margin_after": float(np.mean(chosen_1 - rejected_1)),
        "reward_accuracy": float(np.mean(right_P)),
        "reward_margin": float(beta * np.mean(delta_P)),
    }
    ci95 = {
        "preference_accuracy_before": wilson_interval(float(pref_0) * n, n),
        "preference_accuracy_after": wilson_interval(float(pref_1) * n, n),
        "reward_accuracy": wilson_interval(float(np.sum(right_P)), n),
    }
    return figures, ci95


def chosen_reply(pair: LabeledComparison) -> Message:
    """The last message of the pair's chosen completion (``A`` unless the label is ``B``)."""
    c = pair.comparison
    return (c.completion_A if pair.label == "A" else c.completion_B)[-1]


def chosen_answers(pairs: Sequence[LabeledComparison]) -> list[tuple[list[Message], str]]:
    """``(prompt messages, chosen answer)`` of each pair (ties left out), for a
    :class:`~tempering.evals.reply.ReplyEvaluator`.

    Example::

        ReplyEvaluator(chosen_answers(test_pairs), renderer)
    """
    return [
        (list(pair.comparison.prompt_conversation), chosen_reply(pair)["content"])
        for pair in pairs
        if pair.label != "Tie"
    ]
