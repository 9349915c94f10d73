"""Held-out negative log-likelihood and bits per byte of a chat file, from a sampling client.

:class:`ChatNLLEvaluator` renders each conversation with the model's renderer (the same
tokens and weights SFT trains on), asks the sampling client for the logprob of every token
(``compute_logprobs``: the local engine, ``tempering serve`` and the hosted service all answer
it) and sums ``-logprob`` over the weighted tokens (the assistant replies, by default all of
them). ``nll`` is nats per weighted token; ``bits_per_byte`` is the same total in bits divided
by the UTF-8 bytes of the weighted text, which compares models with different tokenizers.

Example::

    convos = load_chat("held_out.jsonl").items
    evaluator = ChatNLLEvaluator(convos, renderer, tokenizer)
    await evaluator(sampling_client)   # {"chat/nll": 1.93, "chat/bits_per_byte": 0.71, ...}
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from tempering.data import Conversation
from tempering_protocols import Renderer, SamplingClient, Tokenizer, TrainOnWhat
from tempering_protocols.rendering import decode_text

__all__ = ["ChatNLLEvaluator", "NLLResult"]


@attrs.frozen
class NLLResult:
    """Totals over a chat file: ``nll_nats`` summed over ``tokens`` weighted tokens whose text
    is ``bytes`` UTF-8 bytes, in ``conversations`` conversations."""

    name: str
    conversations: int
    tokens: int
    bytes: int
    nll_nats: float

    @property
    def nll(self) -> float:
        """Nats per weighted token."""
        return self.nll_nats / max(self.tokens, 1)

    @property
    def bits_per_byte(self) -> float:
        return self.nll_nats / math.log(2) / max(self.bytes, 1)

    def metrics(self, prefix: str | None = None) -> dict[str, float]:
        p = self.name if prefix is None else prefix
        figures = {
            "nll": self.nll,
            "bits_per_byte": self.bits_per_byte,
            "perplexity": math.exp(min(self.nll, 700.0)),
            "tokens": float(self.tokens),
            "bytes": float(self.bytes),
        }
        return {(f"{p}/{k}" if p else k): v for k, v in figures.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "nll",
            "benchmark": self.name,
            "conversations": self.conversations,
            "metrics": self.metrics(""),
        }


def _weighted_bytes(tokenizer: Tokenizer, tokens: Sequence[int], weights_T: np.ndarray[Any, Any]) -> int:
    """UTF-8 bytes of the text of the weighted tokens (each contiguous run decoded at once)."""
    total = 0
    run: list[int] = []
    for token, weight in zip(tokens, weights_T.tolist(), strict=True):
        if weight > 0:
            run.append(token)
        elif run:
            total += len(decode_text(tokenizer, run).encode("utf-8"))
            run = []
    if run:
        total += len(decode_text(tokenizer, run).encode("utf-8"))
    return total


@attrs.define
class ChatNLLEvaluator:
    """NLL per token and bits per byte of ``conversations`` under a sampling client's model
    (see the module docstring). Each call appends its :class:`NLLResult` to ``results``.
    Satisfies ``SamplingClientEvaluator``."""

    conversations: Sequence[Conversation]
    renderer: Renderer
    tokenizer: Tokenizer
    train_on_what: TrainOnWhat = TrainOnWhat.ALL_ASSISTANT_MESSAGES
    name: str = "chat"
    concurrency: int = 16
    results: list[NLLResult] = attrs.field(factory=list[NLLResult])

    def __attrs_post_init__(self) -> None:
        if not self.conversations:
            raise ValueError(f"ChatNLLEvaluator({self.name}): no conversations")

    async def run(self, sampling_client: SamplingClient) -> NLLResult:
        gate = asyncio.Semaphore(self.concurrency)

        async def one(index: int, conversation: Conversation) -> tuple[float, int, int]:
            example = self.renderer.build_supervised_example(conversation, self.train_on_what)
            tokens = example.model_input.to_ints()
            weights_T = example.weights
            if not weights_T.any():
                raise ValueError(
                    f"ChatNLLEvaluator({self.name}): conversation {index} has no token to score "
                    f"({self.train_on_what}); does it have an assistant message?"
                )
            async with gate:
                logprobs = await sampling_client.compute_logprobs(example.model_input)
            nll = 0.0
            for t, weight in enumerate(weights_T.tolist()):
                if weight > 0:
                    lp = logprobs[t]
                    if lp is None:  # the first token has no context; never weighted in practice
                        continue
                    nll -= weight * lp
            return nll, int((weights_T > 0).sum()), _weighted_bytes(self.tokenizer, tokens, weights_T)

        parts = await asyncio.gather(*(one(i, c) for i, c in enumerate(self.conversations)))
        result = NLLResult(
            name=self.name,
            conversations=len(parts),
            tokens=sum(p[1] for p in parts),
            bytes=sum(p[2] for p in parts),
            nll_nats=sum(p[0] for p in parts),
        )
        self.results.append(result)
        return result

    async def __call__(self, sampling_client: SamplingClient, /) -> dict[str, float]:
        return (await self.run(sampling_client)).metrics()
