"""SDFT, self-distillation fine-tuning: the model rewrites each training answer in its own words,
shown the reference answer, and is fine-tuned on its own rewrites instead of the references.
The targets are then close to the model's own distribution, which is meant to keep what it
already does well (less forgetting) while it learns the task.

- :func:`rewrite_prompt`: the messages that ask the model for a rewrite (``template`` with the
  ``{question}`` and ``{answer}`` fields).
- :func:`self_rewrites`: the model's rewrite of every ``(question, reference)`` pair.
- :func:`keeps_final_answer`: the check a rewrite must pass to replace its reference: the same
  final answer (``####``, ``\\boxed{}``, "the answer is", else the last number; for an answer with
  no number, the answer's text inside the rewrite).
- :func:`sdft_conversations`: the training conversations, each with its rewrite where it passed
  the check and its reference where it did not, and how many passed.
- :func:`final_answer_accuracy`: the greedy reply's final answer against the reference's.

Example::

    rewrites = await self_rewrites(sampler, renderer, pairs)
    conversations, kept = sdft_conversations(pairs, rewrites)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import tinker

from tempering.evals.accuracy import interval_metrics, item_seed
from tempering.grading import extract_answer, normalize_answer
from tempering_protocols import Message, Renderer, SamplingClient

__all__ = [
    "DEFAULT_TEMPLATE",
    "final_answer",
    "final_answer_accuracy",
    "keeps_final_answer",
    "rewrite_prompt",
    "sdft_conversations",
    "self_rewrites",
]

DEFAULT_TEMPLATE = (
    "Here is a question and a correct reference answer.\n\n"
    "Question: {question}\n\n"
    "Reference answer: {answer}\n\n"
    "Answer the question again in your own words, explaining the steps briefly, and end with the "
    "same final answer. Reply with your answer only."
)
"""The default rewrite request (SDFT's "rephrase the demonstration" prompt)."""


def rewrite_prompt(question: str, answer: str, template: str = DEFAULT_TEMPLATE) -> list[Message]:
    """One user message: ``template`` filled with the question and the reference answer.

    Example::

        rewrite_prompt("2+2?", "#### 4")[0]["content"]
    """
    if "{question}" not in template or "{answer}" not in template:
        raise ValueError("an SDFT rewrite template must contain the fields {question} and {answer}")
    return [{"role": "user", "content": template.replace("{question}", question).replace("{answer}", answer)}]


async def self_rewrites(
    sampler: SamplingClient,
    renderer: Renderer,
    pairs: Sequence[tuple[str, str]],
    template: str = DEFAULT_TEMPLATE,
    *,
    max_tokens: int = 128,
    temperature: float = 0.7,
    seed: int = 0,
) -> list[str]:
    """The model's rewrite of each ``(question, reference)`` (one sample at ``temperature``; item
    ``i`` seeded with ``item_seed(seed, "sdft", i)``).

    Example::

        rewrites = await self_rewrites(sampler, renderer, [("2+2?", "2 + 2 = 4\\n#### 4")])
    """
    stop = renderer.get_stop_sequences()

    async def one(i: int) -> str:
        question, answer = pairs[i]
        params = tinker.SamplingParams(
            max_tokens=max_tokens, temperature=temperature, stop=stop, seed=item_seed(seed, "sdft", i)
        )
        prompt = renderer.build_generation_prompt(rewrite_prompt(question, answer, template))
        (sequence,) = (await sampler.sample(prompt, 1, params)).sequences
        message, _ = renderer.parse_response(sequence.tokens)
        return message["content"].strip()

    return list(await asyncio.gather(*(one(i) for i in range(len(pairs)))))


def final_answer(text: str) -> str | None:
    """The final answer of ``text`` (``####``, ``\\boxed{}``, "the answer is", else the last
    number), normalised; ``None`` if it has none."""
    found = extract_answer(text, "auto")
    return None if found is None else normalize_answer(found)


def keeps_final_answer(rewrite: str, reference: str) -> bool:
    """Whether ``rewrite`` ends with the reference's final answer (see :func:`final_answer`); for
    a reference with no number, whether its text (stripped, case-folded) is in the rewrite."""
    if not rewrite.strip():
        return False
    want = final_answer(reference)
    if want is None:
        return reference.strip().casefold() in rewrite.casefold()
    return final_answer(rewrite) == want


def sdft_conversations(
    pairs: Sequence[tuple[str, str]], rewrites: Sequence[str]
) -> tuple[list[list[Message]], int]:
    """``(conversations, kept)``: question then answer, the answer being the rewrite where it
    :func:`keeps_final_answer` and the reference where it does not; ``kept``: rewrites used.

    Example::

        conversations, kept = sdft_conversations([("2+2?", "#### 4")], ["Two and two make 4."])
    """
    if len(rewrites) != len(pairs):
        raise ValueError(f"{len(rewrites)} rewrites for {len(pairs)} questions")
    out: list[list[Message]] = []
    kept = 0
    for (question, reference), rewrite in zip(pairs, rewrites, strict=True):
        good = keeps_final_answer(rewrite, reference)
        kept += good
        user: Message = {"role": "user", "content": question}
        reply: Message = {"role": "assistant", "content": rewrite if good else reference}
        out.append([user, reply])
    return out, kept


async def final_answer_accuracy(
    sampler: SamplingClient,
    renderer: Renderer,
    pairs: Sequence[tuple[str, str]],
    *,
    max_tokens: int = 128,
    seed: int = 0,
) -> tuple[float, tuple[float, float], list[str]]:
    """``(accuracy, its 95% Wilson interval, the replies)``: the greedy reply to each question,
    right when its final answer is the reference's (:func:`final_answer`).

    Example::

        accuracy, ci95, replies = await final_answer_accuracy(sampler, renderer, test_pairs)
    """
    if not pairs:
        raise ValueError("final_answer_accuracy needs at least one (question, reference) pair")
    stop = renderer.get_stop_sequences()

    async def one(i: int) -> str:
        params = tinker.SamplingParams(
            max_tokens=max_tokens, temperature=0.0, stop=stop, seed=item_seed(seed, "sdft-eval", i)
        )
        prompt = renderer.build_generation_prompt([{"role": "user", "content": pairs[i][0]}])
        (sequence,) = (await sampler.sample(prompt, 1, params)).sequences
        message, _ = renderer.parse_response(sequence.tokens)
        return message["content"]

    replies = list(await asyncio.gather(*(one(i) for i in range(len(pairs)))))
    right = sum(
        final_answer(r) is not None and final_answer(r) == final_answer(ref)
        for r, (_, ref) in zip(replies, pairs, strict=True)
    )
    metrics = interval_metrics("accuracy", right, len(pairs))
    return metrics["accuracy"], (metrics["accuracy/ci95_low"], metrics["accuracy/ci95_high"]), replies
