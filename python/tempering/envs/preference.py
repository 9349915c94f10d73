"""Pairwise-preference groups for RLHF: the ``G`` completions of one prompt play a tournament.

Every pair ``(i, j)`` of finished members is compared by a :class:`PreferenceModel`
(concurrently); member ``i`` scores ``p(i ≻ j)`` and member ``j`` scores ``1 - p(i ≻ j)``. With
``symmetric=True`` each pair is also compared in the other order and the two probabilities are
averaged (position bias cancels). A member's group reward is its mean score, its win rate
(in ``[0, 1]``); metrics: ``preference/win_rate``.

Cost: ``G (G - 1) / 2`` comparisons per group (twice that when symmetric).

A win rate is relative to its group (its mean is 0.5 whatever the policy); to *evaluate* a
policy, :class:`ReferenceWinRateGroupBuilder` scores each completion by the probability that it
beats a fixed reference reply instead. :class:`PromptGroups` is an ``RLDataset`` over a fixed
list of group builders.

Example::

    builder = PairwisePreferenceGroupBuilder(prompt, renderer, my_model, group_size=4)
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from tempering.envs.message import MessageEnvAdapter, MessageStepResult
from tempering.envs.problem import exact_match
from tempering_protocols import Env, EnvGroupBuilder, Message, Metrics, Renderer, Trajectory

__all__ = [
    "AnswerEnv",
    "CompletionEnv",
    "PairwisePreferenceGroupBuilder",
    "PreferenceModel",
    "PromptGroups",
    "ReferenceWinRateGroupBuilder",
    "tournament_scores",
]


@runtime_checkable
class PreferenceModel(Protocol):
    """The probability that completion A is better than completion B for a prompt.

    Example::

        class Longer:
            async def __call__(self, prompt, a, b):
                return 1.0 if len(a[-1]["content"]) > len(b[-1]["content"]) else 0.0
    """

    async def __call__(
        self, prompt: Sequence[Message], completion_a: Sequence[Message], completion_b: Sequence[Message], /
    ) -> float: ...


class CompletionEnv:
    """A single-turn message env that records the assistant's completion (reward 0)."""

    def __init__(self, prompt: Sequence[Message]) -> None:
        self.prompt = list(prompt)
        self.completion: Message | None = None

    async def initial_messages(self) -> Sequence[Message]:
        return self.prompt

    async def step(self, message: Message, /) -> MessageStepResult:
        self.completion = message
        return MessageStepResult(reward=0.0, episode_done=True)


class AnswerEnv(CompletionEnv):
    """A :class:`CompletionEnv` that also reports whether the reply equals a reference answer
    (metric ``correct``), so the ground truth is followed beside a preference model."""

    def __init__(self, prompt: Sequence[Message], answer: str) -> None:
        super().__init__(prompt)
        self.answer = answer

    async def step(self, message: Message, /) -> MessageStepResult:
        result = await super().step(message)
        return attrs.evolve(result, metrics={"correct": exact_match(message["content"], self.answer)})


def _completions(envs_G: Sequence[Env]) -> dict[int, Message]:
    """Member index → its parsed completion (members whose reply did not parse are absent)."""
    out: dict[int, Message] = {}
    for g, env in enumerate(envs_G):
        inner = env.env if isinstance(env, MessageEnvAdapter) else None
        if isinstance(inner, CompletionEnv) and inner.completion is not None:
            out[g] = inner.completion
    return out


async def tournament_scores(
    model: PreferenceModel,
    prompt: Sequence[Message],
    completions_G: Sequence[Message],
    *,
    symmetric: bool = True,
) -> list[float]:
    """Each completion's win rate in a round-robin tournament (one value per member, ``[G]``).

    Example::

        await tournament_scores(model, prompt, [c0, c1, c2])   # e.g. [1.0, 0.5, 0.0]
    """
    G = len(completions_G)
    if G < 2:
        return [0.5] * G
    pairs = list(itertools.combinations(range(G), 2))

    async def compare(i: int, j: int) -> float:
        p = float(await model(prompt, [completions_G[i]], [completions_G[j]]))
        if symmetric:
            p = 0.5 * (p + 1.0 - float(await model(prompt, [completions_G[j]], [completions_G[i]])))
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"the preference model returned {p}, not a probability")
        return p

    probs = await asyncio.gather(*(compare(i, j) for i, j in pairs))
    wins_G = [0.0] * G
    for (i, j), p in zip(pairs, probs, strict=True):
        wins_G[i] += p
        wins_G[j] += 1.0 - p
    return [w / (G - 1) for w in wins_G]


@attrs.frozen
class PairwisePreferenceGroupBuilder(EnvGroupBuilder):
    """``group_size`` completions of ``prompt``, rewarded by their tournament win rate.

    A completion that fails to parse scores 0 and is left out of the tournament.
    """

    prompt: Sequence[Message]
    renderer: Renderer = attrs.field(eq=False)
    preference_model: PreferenceModel = attrs.field(eq=False)
    group_size: int = 4
    symmetric: bool = True
    tag: str = "preference"

    async def make_envs(self) -> Sequence[Env]:
        return [
            MessageEnvAdapter(
                CompletionEnv(self.prompt), self.renderer, on_parse_error="penalty", penalty=0.0
            )
            for _ in range(self.group_size)
        ]

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        completions = _completions(envs_G)
        members = sorted(completions)
        scores = await tournament_scores(
            self.preference_model, self.prompt, [completions[g] for g in members], symmetric=self.symmetric
        )
        by_member = dict(zip(members, scores, strict=True))
        return [
            (by_member.get(g, 0.0), {"preference/win_rate": by_member.get(g, 0.0)})
            for g in range(len(envs_G))
        ]

    def logging_tags(self) -> list[str]:
        return [self.tag]


@attrs.frozen
class ReferenceWinRateGroupBuilder(EnvGroupBuilder):
    """``group_size`` replies to ``prompt``, each rewarded by the preference model's probability
    that it beats the fixed ``reference`` reply: an absolute reward (unlike a tournament's win
    rate, whose group mean is always 0.5), for evaluating a policy. A reply that does not parse
    scores 0; metric ``correct``: the reply equals the reference's text.

    Example::

        builder = ReferenceWinRateGroupBuilder(prompt, {"role": "assistant", "content": "4"}, renderer,
                                               judge, group_size=2)
    """

    prompt: Sequence[Message]
    reference: Message
    renderer: Renderer = attrs.field(eq=False)
    preference_model: PreferenceModel = attrs.field(eq=False)
    group_size: int = 2
    tag: str = "vs_reference"

    async def make_envs(self) -> Sequence[Env]:
        answer = self.reference["content"]
        adapt = functools.partial(MessageEnvAdapter, on_parse_error="penalty", penalty=0.0)
        return [adapt(AnswerEnv(self.prompt, answer), self.renderer) for _ in range(self.group_size)]

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        completions = _completions(envs_G)
        scores = [
            await self.preference_model(self.prompt, [completions[g]], [self.reference])
            if g in completions
            else 0.0
            for g in range(len(envs_G))
        ]
        return [(s, {"preference/win_rate_vs_reference": s}) for s in scores]

    def logging_tags(self) -> list[str]:
        return [self.tag]


class PromptGroups:
    """An ``RLDataset`` of groups over a fixed list of builders: batch ``i`` is builders
    ``i * batch_size .. (i + 1) * batch_size - 1`` (the last partial batch dropped).

    Example::

        ds = PromptGroups([builder_0, builder_1, builder_2, builder_3], batch_size=2)
        len(ds), ds.get_batch(1)      # 2, [builder_2, builder_3]
    """

    def __init__(self, builders: Sequence[EnvGroupBuilder], batch_size: int) -> None:
        self.builders = list(builders)
        self.batch_size = batch_size

    def __len__(self) -> int:
        return len(self.builders) // self.batch_size

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        return self.builders[index * self.batch_size : (index + 1) * self.batch_size]
