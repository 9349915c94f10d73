"""Pairwise-preference groups for RLHF: the ``G`` completions of one prompt play a tournament.

Every pair ``(i, j)`` of finished members is compared by a :class:`PreferenceModel`
(concurrently); member ``i`` scores ``p(i ≻ j)`` and member ``j`` scores ``1 - p(i ≻ j)``. With
``symmetric=True`` each pair is also compared in the other order and the two probabilities are
averaged (position bias cancels). A member's group reward is its mean score, its win rate
(in ``[0, 1]``); metrics: ``preference/win_rate``.

Cost: ``G (G - 1) / 2`` comparisons per group (twice that when symmetric).

Example::

    builder = PairwisePreferenceGroupBuilder(prompt, renderer, my_model, group_size=4)
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from tempering.envs.message import MessageEnvAdapter, MessageStepResult
from tempering_protocols import Env, EnvGroupBuilder, Message, Metrics, Renderer, Trajectory

__all__ = ["CompletionEnv", "PairwisePreferenceGroupBuilder", "PreferenceModel", "tournament_scores"]


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
        completions: dict[int, Message] = {}
        for g, env in enumerate(envs_G):
            inner = env.env if isinstance(env, MessageEnvAdapter) else None
            if isinstance(inner, CompletionEnv) and inner.completion is not None:
                completions[g] = inner.completion
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
