"""Exact-match accuracy of a sampling client's greedy replies to held-out conversations.

- :func:`held_out_replies`: ``(prompt messages, reference)`` of each conversation that ends with
  an assistant message.
- :class:`ReplyEvaluator`: answers every prompt greedily and compares the parsed reply with the
  reference; keeps the first few replies (:class:`ReplyRecord`).
- :func:`format_replies`, :func:`replies_json`: two evaluations side by side, for a terminal or a
  ``summary.json``.

Example::

    evaluator = ReplyEvaluator(held_out_replies(conversations), renderer)
    await evaluator(sampling_client)        # {"test/exact_match": 0.42, ...}
    print(format_replies(evaluator.records[0], evaluator.records[-1]))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import tinker

from tempering.envs.problem import exact_match
from tempering.evals.accuracy import interval_metrics, item_seed
from tempering_protocols import Message, Renderer, SamplingClient

__all__ = ["Reply", "ReplyEvaluator", "ReplyRecord", "format_replies", "held_out_replies", "replies_json"]


@attrs.frozen
class Reply:
    """One held-out conversation's last user turn, its reference answer and the model's reply."""

    prompt: str
    reference: str
    reply: str
    correct: bool


@attrs.frozen
class ReplyRecord:
    """One evaluation: the exact-match accuracy with its 95% Wilson interval over the items, the
    mean reply length in characters and the first few replies."""

    exact_match: float
    mean_chars: float
    replies: tuple[Reply, ...]
    exact_match_ci95: tuple[float, float] = (0.0, 1.0)


def held_out_replies(conversations: Sequence[Sequence[Message]]) -> list[tuple[list[Message], str]]:
    """``(prompt messages, reference answer)`` of each conversation that ends with an assistant
    message: the prompt is everything before it.

    Example::

        held_out_replies([[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]])
        # [([{"role": "user", "content": "2+2?"}], "4")]
    """
    out: list[tuple[list[Message], str]] = []
    for conversation in conversations:
        if len(conversation) >= 2 and conversation[-1]["role"] == "assistant":
            out.append((list(conversation[:-1]), conversation[-1]["content"]))
    return out


@attrs.define
class ReplyEvaluator:
    """Exact-match accuracy of replies (``<name>/exact_match``, with ``…/ci95_low`` and
    ``…/ci95_high``, its 95% Wilson interval): each prompt is answered once at ``temperature``
    (default 0, greedy; at most ``max_tokens`` tokens) and the parsed reply, stripped, must equal
    the reference. Item ``i``'s request is seeded with :func:`~tempering.evals.accuracy.item_seed`
    ``(seed, "reply", i)``, so at a temperature above 0 every item draws independently. Each call
    appends a :class:`ReplyRecord` holding the first ``n_show`` replies to ``records``. Satisfies
    ``SamplingClientEvaluator``.

    Example::

        evaluator = ReplyEvaluator(held_out_replies(conversations), renderer)
        await evaluator(sampling_client)        # {"test/exact_match": 0.42, ...}
        evaluator.records[-1].replies[0].reply  # "137"
    """

    items: Sequence[tuple[Sequence[Message], str]]
    renderer: Renderer
    max_tokens: int = 16
    n_show: int = 5
    name: str = "test"
    temperature: float = 0.0
    seed: int = 0
    records: list[ReplyRecord] = attrs.field(factory=list[ReplyRecord])

    def __attrs_post_init__(self) -> None:
        if not self.items:
            raise ValueError("ReplyEvaluator needs at least one (prompt, reference) item")

    async def __call__(self, sampling_client: SamplingClient, /) -> dict[str, float]:
        stop = self.renderer.get_stop_sequences()
        futures = [
            sampling_client.sample(
                self.renderer.build_generation_prompt(list(prompt)),
                1,
                tinker.SamplingParams(
                    max_tokens=self.max_tokens,
                    temperature=self.temperature,
                    stop=stop,
                    seed=item_seed(self.seed, "reply", i),
                ),
            )
            for i, (prompt, _) in enumerate(self.items)
        ]
        replies: list[Reply] = []
        for (prompt, reference), future in zip(self.items, futures, strict=True):
            (sequence,) = (await future).sequences
            message, _ = self.renderer.parse_response(sequence.tokens)
            text = message["content"]
            replies.append(Reply(prompt[-1]["content"], reference, text, exact_match(text, reference) == 1.0))
        key = f"{self.name}/exact_match"
        metrics = interval_metrics(key, sum(r.correct for r in replies), len(replies))
        mean_chars = sum(len(r.reply) for r in replies) / len(replies)
        ci = (metrics[f"{key}/ci95_low"], metrics[f"{key}/ci95_high"])
        self.records.append(ReplyRecord(metrics[key], mean_chars, tuple(replies[: self.n_show]), ci))
        return metrics


def format_replies(before: ReplyRecord, after: ReplyRecord, label: str = "after") -> str:
    """The replies of two evaluations side by side, one held-out prompt per line."""
    lines: list[str] = []
    for b, a in zip(before.replies, after.replies, strict=True):
        mark = "ok" if a.correct else "--"
        lines.append(
            f"  [{mark}] {a.prompt!r} -> {a.reply!r} (reference {a.reference!r}; before: {b.reply!r})"
        )
    return f"held-out replies ({label}, greedy):\n" + "\n".join(lines)


def replies_json(before: ReplyRecord, after: ReplyRecord) -> list[dict[str, Any]]:
    """The replies of two evaluations as JSON rows for ``summary.json``."""
    return [
        {
            "prompt": a.prompt,
            "reference": a.reference,
            "before": b.reply,
            "after": a.reply,
            "correct": a.correct,
        }
        for b, a in zip(before.replies, after.replies, strict=True)
    ]
