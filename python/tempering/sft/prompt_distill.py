"""Prompt distillation's data: the teacher answers queries *with* instructions in its system
prompt; the student is trained on the same queries *without* them, to behave the same.

- :func:`query_of`: a conversation's query (everything before its last assistant message, system
  messages dropped) and its reference answer.
- :func:`with_instructions`: the query as the teacher sees it (``instructions`` as the system
  message).
- :func:`teacher_answers`: the teacher's sampled answer to each query, read with the instructions.
- :func:`prompt_distill_datums`: the student's training datums, either the teacher's answers as
  plain text (SFT) or the teacher's top-K over them, the teacher reading the instructions
  (:func:`tempering.sft.offpolicy.collect_topk_datums` with ``teacher_tokens``).

Shapes: ``T`` tokens of a conversation, ``K`` teacher tokens per position.

Example::

    queries = [query_of(c) for c in conversations]
    answers = await teacher_answers(teacher, renderer, [q for q, _ in queries], instructions)
    datums = await prompt_distill_datums(renderer, queries, answers, instructions, teacher=teacher, k=20)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Literal

import tinker

from tempering.data.datums import conversations_to_datums
from tempering.evals.accuracy import item_seed
from tempering.sft.offpolicy import collect_topk_datums, rendered
from tempering_protocols import Message, Renderer, SamplingClient, TrainOnWhat

__all__ = [
    "TargetKind",
    "prompt_distill_datums",
    "query_of",
    "teacher_answers",
    "with_instructions",
]

TargetKind = Literal["sample", "topk"]
"""``sample``: SFT on the teacher's sampled answers; ``topk``: the teacher's top-K over them."""


def query_of(conversation: Sequence[Message]) -> tuple[list[Message], str]:
    """``(query, reference)``: the messages before the last assistant message, without system
    messages, and that message's text.

    Example::

        query_of([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}])   # ([{"role": "user", ...}], "4")
    """
    last = max((i for i, m in enumerate(conversation) if m["role"] == "assistant"), default=-1)
    if last < 1:
        raise ValueError(
            "prompt distillation needs conversations that end with an assistant answer to a query"
        )
    query = [m for m in conversation[:last] if m["role"] != "system"]
    if not query:
        raise ValueError("a conversation has no user message before its last assistant answer")
    return query, conversation[last]["content"]


def with_instructions(query: Sequence[Message], instructions: str) -> list[Message]:
    """The query as the teacher reads it: ``instructions`` as its system message."""
    system: Message = {"role": "system", "content": instructions}
    return [system, *query]


async def teacher_answers(
    teacher: SamplingClient,
    renderer: Renderer,
    queries: Sequence[Sequence[Message]],
    instructions: str,
    *,
    max_tokens: int = 64,
    temperature: float = 0.7,
    seed: int = 0,
) -> list[str]:
    """The teacher's answer to each query, read with ``instructions`` (one sample each, at
    ``temperature``; item ``i`` seeded with ``item_seed(seed, "prompt-distill", i)``).

    Example::

        answers = await teacher_answers(teacher, renderer, [[{"role": "user", "content": "2+2?"}]],
                                        "Answer with the number only.")
    """
    if not instructions.strip():
        raise ValueError("prompt distillation needs instructions (the teacher's system prompt), got none")
    stop = renderer.get_stop_sequences()

    async def one(i: int) -> str:
        params = tinker.SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            seed=item_seed(seed, "prompt-distill", i),
        )
        prompt = renderer.build_generation_prompt(with_instructions(queries[i], instructions))
        (sequence,) = (await teacher.sample(prompt, 1, params)).sequences
        message, _ = renderer.parse_response(sequence.tokens)
        return message["content"]

    return list(await asyncio.gather(*(one(i) for i in range(len(queries)))))


def _answered(query: Sequence[Message], answer: str) -> list[Message]:
    reply: Message = {"role": "assistant", "content": answer}
    return [*query, reply]


async def prompt_distill_datums(
    renderer: Renderer,
    queries: Sequence[Sequence[Message]],
    answers: Sequence[str],
    instructions: str,
    *,
    targets: TargetKind = "sample",
    teacher: SamplingClient | None = None,
    k: int = 20,
) -> list[tinker.Datum]:
    """The student's datums: each query *without* the instructions, then the teacher's answer;
    trained on the answer as text (``targets="sample"``) or on the teacher's top ``k`` over it,
    the teacher reading the query *with* the instructions (``targets="topk"``, needs ``teacher``).

    Example::

        datums = await prompt_distill_datums(renderer, queries, answers, instructions)
    """
    if len(answers) != len(queries):
        raise ValueError(f"{len(answers)} answers for {len(queries)} queries")
    student = [_answered(q, a) for q, a in zip(queries, answers, strict=True)]
    last = TrainOnWhat.LAST_ASSISTANT_MESSAGE
    if targets == "sample":
        return conversations_to_datums(renderer, student, last)
    if targets != "topk":
        raise ValueError(f"targets must be 'sample' or 'topk', got {targets!r}")
    if teacher is None:
        raise ValueError("targets='topk' needs the teacher's sampling client")
    seen = [_answered(with_instructions(q, instructions), a) for q, a in zip(queries, answers, strict=True)]
    teacher_tokens = [tokens for tokens, _ in rendered(renderer, seen, last)]
    return await collect_topk_datums(
        teacher, rendered(renderer, student, last), k, teacher_tokens=teacher_tokens
    )
