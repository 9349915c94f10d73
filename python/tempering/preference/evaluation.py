"""Held-out evaluation on labeled comparisons: the policy's log-probability of each pair's
chosen and rejected completion, and the chosen answers as reference replies.

Shapes: ``P`` pairs; ``D = 2 P`` datums (chosen at even ``d``, rejected at odd).

Example::

    chosen_P, rejected_P = await pair_logprobs(sampler, renderer, test_pairs)
    ReplyEvaluator(chosen_answers(test_pairs), renderer)    # tempering.evals.reply
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tempering.preference.data import pair_datums
from tempering.preference.dpo import reference_logprobs
from tempering_protocols import LabeledComparison, Message, Renderer, SamplingClient

__all__ = ["chosen_answers", "chosen_reply", "pair_logprobs"]


async def pair_logprobs(
    sampler: SamplingClient, renderer: Renderer, pairs: Sequence[LabeledComparison]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
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
