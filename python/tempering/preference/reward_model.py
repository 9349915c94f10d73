"""A pairwise reward model: the policy learns to answer "A" or "B" to a comparison prompt.

Design. A comparison (prompt conversation, completions A and B) becomes one user message that
shows the conversation and both completions and asks which is better; the model is trained by
plain supervised learning (the SFT loop, cross-entropy on the verdict message) to answer with
the preferred letter. Every pair is shown in both orders, so the model cannot win by favouring
a position. As a :class:`PreferenceModel` it reads, from a sampling client, the logprobs of the
two verdict tokens after the prompt (``compute_logprobs`` of prompt + "A" and of prompt + "B"):
``P(A) = σ(log p(A) - log p(B))``, averaged over both orders (``P(A | A,B)`` and
``1 - P(A | B,A)``). Any checkpoint saved for sampling can be loaded back as one, so an RL
trainer can use it as a reward.

Shapes: ``data_D`` two datums per non-tied pair (original order, then swapped).

Example::

    config = RewardModelConfig(run=RunConfig(log_dir="runs/rm"))
    result = asyncio.run(config())       # or: tempering rm --run.log-dir runs/rm
    model = await VerdictPreferenceModel.load(result.final.sampler_path, config.model)
    p = await model(comparison)          # P(completion A preferred)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs
import numpy as np
import tinker

from tempering.backend import ModelConfig, ServiceClient, service_client
from tempering.data import BatchedDataset
from tempering.data.datums import examples_to_datums
from tempering.preference.data import ComparisonData
from tempering.renderers import get_renderer, render_supervised_batch_sync
from tempering.sft import train_supervised
from tempering.training import FineTuningConfig, TrainResult
from tempering_protocols import (
    Comparison,
    LabeledComparison,
    Message,
    Renderer,
    SamplingClient,
    Tokenizer,
    TrainOnWhat,
)

__all__ = [
    "PreferenceAccuracyEvaluator",
    "PreferenceModel",
    "RewardModelConfig",
    "VerdictDataset",
    "VerdictPreferenceModel",
    "comparison_prompt",
]


@runtime_checkable
class PreferenceModel(Protocol):
    """Given a comparison, the probability that completion A is preferred to completion B.

    Example::

        p_A = await preference_model(Comparison(prompt, completion_a, completion_b))
    """

    async def __call__(self, comparison: Comparison, /) -> float: ...


def _text(messages: Sequence[Message]) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def comparison_prompt(comparison: Comparison) -> list[Message]:
    """The one user message that asks the model to pick the better completion."""
    content = (
        f"Conversation:\n{_text(comparison.prompt_conversation)}\n\n"
        f"Response A:\n{_text(comparison.completion_A)}\n\n"
        f"Response B:\n{_text(comparison.completion_B)}\n\n"
        "Which response is better? Answer A or B."
    )
    return [{"role": "user", "content": content}]


def _verdict_conversations(pairs: Sequence[LabeledComparison]) -> list[list[Message]]:
    out: list[list[Message]] = []
    for pair in pairs:
        if pair.label == "Tie":
            continue
        for labeled in (pair, pair.swap()):
            verdict: Message = {"role": "assistant", "content": labeled.label}
            out.append([*comparison_prompt(labeled.comparison), verdict])
    return out


class VerdictDataset:
    """Comparisons as supervised data: a ``SupervisedDataset`` whose datums train the verdict.

    Example::

        ds = VerdictDataset(BatchedDataset(pairs, 8), renderer)
        ds.get_batch(0)   # 16 datums: each pair in both orders
    """

    def __init__(
        self, pairs: BatchedDataset[LabeledComparison], renderer: Renderer, max_length: int | None = None
    ) -> None:
        self.pairs = pairs
        self.renderer = renderer
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.pairs)

    def set_epoch(self, seed: int, /) -> None:
        self.pairs.set_epoch(seed)

    def get_batch(self, index: int, /) -> list[tinker.Datum]:
        conversations = _verdict_conversations(self.pairs.get_batch(index))
        examples = render_supervised_batch_sync(
            self.renderer, conversations, TrainOnWhat.LAST_ASSISTANT_MESSAGE
        )
        return examples_to_datums(examples, max_length=self.max_length)


def _single_token(tokenizer: Tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"the verdict {text!r} is {len(ids)} tokens for this tokenizer; it must be one")
    return ids[0]


@attrs.define
class VerdictPreferenceModel:
    """A :class:`PreferenceModel` from a sampling client of a trained verdict model (see the
    module docstring for how ``P(A)`` is read).

    Example::

        model = VerdictPreferenceModel(sampler, renderer, tokenizer)
        await model(comparison)   # 0.93
    """

    sampler: SamplingClient
    renderer: Renderer
    tokenizer: Tokenizer

    @classmethod
    async def load(
        cls, sampler_path: str, model: ModelConfig, service: ServiceClient | None = None
    ) -> VerdictPreferenceModel:
        """The preference model saved at ``sampler_path`` (a ``save_weights_for_sampler`` path)."""
        service = service if service is not None else service_client()
        sampler = await service.create_sampling_client(model_path=sampler_path)
        tokenizer = model.tokenizer()
        return cls(sampler, get_renderer(model.renderer(), tokenizer), tokenizer)

    async def _p_first(self, comparison: Comparison) -> float:
        """``σ(log p(A) - log p(B))`` after the prompt, for this order."""
        prompt = self.renderer.build_generation_prompt(comparison_prompt(comparison))
        a, b = _single_token(self.tokenizer, "A"), _single_token(self.tokenizer, "B")
        lp_a, lp_b = await asyncio.gather(
            self.sampler.compute_logprobs(prompt.append_int(a)),
            self.sampler.compute_logprobs(prompt.append_int(b)),
        )
        diff = float(lp_a[-1] or 0.0) - float(lp_b[-1] or 0.0)
        return 1.0 / (1.0 + math.exp(-diff))

    async def __call__(self, comparison: Comparison, /) -> float:
        p_ab, p_ba = await asyncio.gather(self._p_first(comparison), self._p_first(comparison.swap()))
        return 0.5 * (p_ab + (1.0 - p_ba))


@attrs.define
class PreferenceAccuracyEvaluator:
    """Held-out accuracy of the verdict model (``test/pref_accuracy``: ``P(A) > 0.5`` agrees
    with the label; ties left out) and its log loss (``test/pref_logloss``). Satisfies
    ``SamplingClientEvaluator``.

    Example::

        metrics = await PreferenceAccuracyEvaluator(pairs, renderer, tokenizer)(sampler)
    """

    pairs: Sequence[LabeledComparison]
    renderer: Renderer
    tokenizer: Tokenizer

    async def __call__(self, sampling_client: SamplingClient, /) -> dict[str, float]:
        model = VerdictPreferenceModel(sampling_client, self.renderer, self.tokenizer)
        labeled = [p for p in self.pairs if p.label != "Tie"]
        p_A = np.asarray(await asyncio.gather(*(model(p.comparison) for p in labeled)))
        is_A = np.asarray([p.label == "A" for p in labeled])
        p_label = np.clip(np.where(is_A, p_A, 1.0 - p_A), 1e-9, 1.0)
        return {
            "test/pref_accuracy": float(np.mean((p_A > 0.5) == is_A)),
            "test/pref_logloss": float(-np.mean(np.log(p_label))),
        }


@attrs.frozen(kw_only=True)
class RewardModelConfig(FineTuningConfig):
    """A reward-model run: SFT on verdicts, evaluated by held-out preference accuracy.
    Picklable; calling it (``await config()``) runs it. The settings besides ``data`` are
    :class:`~tempering.training.FineTuningConfig`'s; an epoch passes over the training pairs,
    each giving two verdict examples.

    Example::

        result = asyncio.run(RewardModelConfig(run=RunConfig(log_dir="runs/rm"), max_steps=40)())
    """

    data: ComparisonData = attrs.field(factory=ComparisonData)

    async def __call__(self, service: ServiceClient | None = None) -> TrainResult:
        tokenizer = self.model.tokenizer()
        renderer = get_renderer(self.model.renderer(), tokenizer)
        train, test = self.data()
        evaluators = (
            [] if test is None else [PreferenceAccuracyEvaluator(list(test.items), renderer, tokenizer)]
        )
        return await train_supervised(
            self.resolved("rm"),
            run=self.run,
            model=self.model,
            adam=self.adam,
            train=VerdictDataset(train, renderer, self.data.max_length),
            num_epochs=self.num_epochs,
            max_steps=self.max_steps,
            sampling_evaluators=evaluators,
            service=service,
            stage="rm",
        )
