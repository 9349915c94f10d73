"""Guess the number's scripted players and episode statistics (re-exported by
:mod:`tempering.envs.guess_number`, which describes the game and its metrics).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from tempering.envs.message import PrefixedFigures
from tempering_protocols import Message, Trajectory

__all__ = [
    "INTEGER",
    "GuessNumberStats",
    "GuessPolicy",
    "bisect_guess",
    "feasible_range",
    "guess_number_stats",
    "random_consistent_guess",
]

INTEGER = re.compile(r"\d+")
"""A valid guess: a plain non-negative integer."""


def feasible_range(messages: Sequence[Message], low: int, high: int) -> tuple[int, int]:
    """The secrets still possible after the feedback in ``messages`` (``(lo, hi)``, inclusive;
    ``lo > hi`` when the feedback contradicts itself). Reads each assistant guess and the
    user's answer after it."""
    lo, hi = low, high
    for reply, answer in itertools.pairwise(messages):
        if reply["role"] != "assistant" or answer["role"] != "user":
            continue
        text = reply["content"].strip()
        if INTEGER.fullmatch(text) is None:
            continue
        guess = int(text)
        if answer["content"] == "higher":
            lo = max(lo, guess + 1)
        elif answer["content"] == "lower":
            hi = min(hi, guess - 1)
    return lo, hi


GuessPolicy = Callable[[Sequence[Message], int, int, random.Random], int]
"""A scripted player: ``(conversation so far, low, high, rng) -> guess``."""


def bisect_guess(messages: Sequence[Message], low: int, high: int, rng: random.Random) -> int:
    """The midpoint ``(lo + hi) // 2`` of the feasible range: finds any secret of ``n``
    numbers in at most ``ceil(log2(n + 1))`` guesses. ``rng`` is unused (same signature as
    :func:`random_consistent_guess`)."""
    del rng
    lo, hi = feasible_range(messages, low, high)
    return (lo + hi) // 2 if lo <= hi else low


def random_consistent_guess(messages: Sequence[Message], low: int, high: int, rng: random.Random) -> int:
    """A uniformly random number of the feasible range: legal, never wasted, but slower than
    bisection (``2 (1 + 1/n) H_n - 3`` guesses on average for ``n`` numbers, ``H_n`` the
    harmonic number: 4.2 for ``n = 16``, against 3.4 for bisection)."""
    lo, hi = feasible_range(messages, low, high)
    return rng.randint(lo, hi) if lo <= hi else low


@attrs.frozen
class GuessNumberStats(PrefixedFigures):
    """Summary of finished guess-number episodes (fractions in ``[0, 1]``).

    ``success``: found the secret; ``turns``: guesses per episode (all episodes);
    ``turns_found``: guesses per successful episode (NaN when none); ``invalid``: ended by an
    invalid reply; ``inconsistent``: fraction of valid guesses already ruled out.
    """

    episodes: int
    success: float
    turns: float
    turns_found: float
    invalid: float
    inconsistent: float
    reward: float


def guess_number_stats(trajectories: Sequence[Trajectory]) -> GuessNumberStats:
    """:class:`GuessNumberStats` of finished episodes (each the trajectory of a
    :class:`GuessNumberEnv`).

    Example::

        stats = guess_number_stats([t for r in rollouts if r.group for t in r.group.trajectories_G])
    """
    found: list[float] = []
    turns: list[float] = []
    turns_found: list[float] = []
    invalid: list[float] = []
    inconsistent: list[float] = []
    rewards: list[float] = []
    for traj in trajectories:
        if not traj.transitions:
            continue
        last = traj.transitions[-1].metrics
        ok = float(last.get("guess/found", 0))
        n = float(last.get("guess/turns", len(traj.transitions)))
        found.append(ok)
        turns.append(n)
        if ok:
            turns_found.append(n)
        invalid.append(float(last.get("guess/invalid", 0)))
        inconsistent += [
            float(t.metrics["guess/inconsistent"])
            for t in traj.transitions
            if "guess/inconsistent" in t.metrics
        ]
        rewards.append(sum(t.reward for t in traj.transitions))

    def mean(xs: list[float]) -> float:
        return float(np.mean(xs)) if xs else float("nan")

    return GuessNumberStats(
        episodes=len(found),
        success=mean(found),
        turns=mean(turns),
        turns_found=mean(turns_found),
        invalid=mean(invalid),
        inconsistent=mean(inconsistent),
        reward=mean(rewards),
    )
