"""The reverse KL of a student to a teacher on held-out prompts, estimated per token from the
student's own samples (the quantity on-policy distillation lowers).

Shapes: ``T`` tokens of one sampled answer.

Example::

    kl = await heldout_reverse_kl(student, teacher, test_problems, renderer, num_samples=4, seed=0)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import tinker

from tempering.envs.problem import Problem
from tempering.evals.accuracy import item_seed
from tempering_protocols import Renderer, SamplingClient

__all__ = ["heldout_reverse_kl"]


async def heldout_reverse_kl(
    student: SamplingClient,
    teacher: SamplingClient,
    problems: Sequence[Problem],
    renderer: Renderer,
    *,
    num_samples: int = 4,
    max_tokens: int = 8,
    seed: int = 0,
) -> float:
    """The student's reverse KL to the teacher on ``problems``, estimated per token: the mean of
    ``logp_student(x_t) - logp_teacher(x_t)`` over every token ``x_t`` of ``num_samples`` answers
    per problem sampled from the student at T=1. Problem ``p`` is sampled with its own seed,
    :func:`~tempering.evals.accuracy.item_seed` ``(seed, "reverse-kl", p)``. No weights change.

    Example::

        kl = await heldout_reverse_kl(student, teacher, test_problems, renderer)
    """
    stop = renderer.get_stop_sequences()
    prompts = [renderer.build_generation_prompt([{"role": "user", "content": p.question}]) for p in problems]
    responses = await asyncio.gather(
        *(
            student.sample(
                m,
                num_samples,
                tinker.SamplingParams(
                    max_tokens=max_tokens, temperature=1.0, stop=stop, seed=item_seed(seed, "reverse-kl", p)
                ),
            )
            for p, m in enumerate(prompts)
        )
    )

    async def one(prompt: tinker.ModelInput, seq: tinker.SampledSequence) -> tuple[float, int]:
        tokens_T = list(seq.tokens)
        if not tokens_T or seq.logprobs is None:
            return 0.0, 0
        scored = await teacher.compute_logprobs(tinker.ModelInput.from_ints([*prompt.to_ints(), *tokens_T]))
        teacher_T = np.array([np.nan if x is None else x for x in scored[-len(tokens_T) :]], dtype=np.float64)
        student_T = np.asarray(seq.logprobs, dtype=np.float64)
        ok = ~np.isnan(teacher_T)
        return float((student_T[ok] - teacher_T[ok]).sum()), int(ok.sum())

    parts = await asyncio.gather(
        *(one(m, seq) for m, response in zip(prompts, responses, strict=True) for seq in response.sequences)
    )
    total = sum(s for s, _ in parts)
    count = sum(n for _, n in parts)
    return total / count if count else 0.0
