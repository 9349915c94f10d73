"""Guess-number under the token env's rules (:mod:`tempering.envs.guess_number`), as an in-context
task family: the discrete game that a tempering RL run on the token env plays, so that its games
can be logged as learning histories (:mod:`tempering.ad.rl_source`) and both model kinds can be
evaluated on the same game.

The token env's game ends at the correct guess or at an invalid reply; an in-context task's
episode has exactly ``horizon`` steps (``tempering_protocols.InContextTask``). So a game that
ends early is **padded**: its remaining turns are in the absorbing state ``over``, where the only
logged action is ``none`` (nothing was asked) and every action earns 0. An invalid reply (not a
number in ``1..high``, or no stop token) is the named action ``invalid``: it ends the game with
reward 0, as the env ends it (the env's -1 is a training signal of the RL run, not logged here).

=============  ===================================================================================
states         ``0`` start, ``1`` higher, ``2`` lower (the feedback on the last guess), ``3`` over
actions        ``0..high-1``: the guesses ``1..high``; ``high``: ``invalid``; ``high + 1``: ``none``
reward         1 for the correct guess (it ends the game), else 0; the best return is 1
held-out       the odd numbers (as :class:`~tempering.ad.tasks.GuessNumberFamily`)
source         a scripted learner: binary search, the number remembered once found (the RL run is
               the other source: :func:`~tempering.ad.rl_source.rl_histories`)
=============  ===================================================================================

Example::

    family = GuessNumberEnvFamily(high=16, horizon=6)
    task = family.task(0, False)          # the secret 2
    task.reset(), task.step(7), task.step(1)   # 0, (2, 0.0), (3, 1.0)
"""

from __future__ import annotations

import attrs

from tempering_protocols import InContextTask, SourceLearner

__all__ = ["GuessNumberEnvFamily", "GuessNumberEnvTask"]

START, HIGHER, LOWER, OVER = 0, 1, 2, 3
STATE_WORDS = ("start", "higher", "lower", "over")


class GuessNumberEnvTask:
    """A hidden number in ``1..high``; a game ends at the correct guess or an invalid action, and
    the turns left are the absorbing state ``over``."""

    def __init__(self, high: int, secret: int) -> None:
        self.high = high
        self.secret = secret
        self.over = False

    def reset(self) -> int:
        self.over = False
        return START

    def step(self, action: int, /) -> tuple[int, float]:
        if self.over:
            return OVER, 0.0
        guess = action + 1
        if action >= self.high:  # invalid, or none while the game is on: the env ends it
            self.over = True
            return OVER, 0.0
        if guess == self.secret:
            self.over = True
            return OVER, 1.0
        return (HIGHER if self.secret > guess else LOWER), 0.0

    def optimal_return(self) -> float:
        return 1.0


class _ScriptedSearcher:
    """Binary search within a game; the number, once found, is guessed first in every game after;
    ``none`` once the game is over."""

    def __init__(self, high: int) -> None:
        self.high = high
        self.known: int | None = None
        self.lo, self.hi = 1, high

    def act(self, state: int, /) -> tuple[int, float]:
        if state == OVER:
            return self.high + 1, 0.0
        if self.known is not None:
            return self.known - 1, 0.0
        return (self.lo + self.hi) // 2 - 1, 0.0

    def update(self, state: int, action: int, reward: float, next_state: int, done: bool, /) -> None:
        guess = action + 1
        if reward > 0:
            self.known = guess
        elif next_state == HIGHER:
            self.lo = guess + 1
        elif next_state == LOWER:
            self.hi = guess - 1
        if done:
            self.lo, self.hi = 1, self.high


@attrs.frozen(kw_only=True)
class GuessNumberEnvFamily:
    """Guess-number under the token env's rules; see the module docstring. ``high`` and
    ``horizon`` are the env's (``GuessNumberRules(low=1, high=high, max_turns=horizon)``).

    Example::

        GuessNumberEnvFamily(high=16, horizon=6).task(1, True).secret     # 3
    """

    high: int = 16
    horizon: int = 6
    """Turns per game: the env's ``max_turns``, and each episode's length here."""

    def __attrs_post_init__(self) -> None:
        if self.high < 2 or self.horizon < 1:
            raise ValueError(
                f"GuessNumberEnvFamily: high must be >= 2 and horizon >= 1, got {self.high}, {self.horizon}"
            )

    @property
    def name(self) -> str:
        return "guess-number-env"

    @property
    def n_states(self) -> int:
        return len(STATE_WORDS)

    @property
    def n_actions(self) -> int:
        return self.high + 2

    @property
    def invalid_action(self) -> int:
        """The action of a reply that named no number in ``1..high``."""
        return self.high

    @property
    def none_action(self) -> int:
        """The action logged on a padded turn (the game is over)."""
        return self.high + 1

    def numbers(self, held_out: bool) -> list[int]:
        """The secrets of one split: the odd numbers held out, the even ones trained on."""
        return [n for n in range(1, self.high + 1) if (n % 2 == 1) == held_out]

    def task(self, seed: int, held_out: bool, /) -> GuessNumberEnvTask:
        numbers = self.numbers(held_out)
        return GuessNumberEnvTask(self.high, numbers[seed % len(numbers)])

    def learner(self, task: InContextTask, seed: int, /) -> SourceLearner:
        return _ScriptedSearcher(self.high)

    def describe_state(self, state: int, /) -> str:
        return STATE_WORDS[state]

    def describe_action(self, action: int, /) -> str:
        if action == self.high:
            return "invalid"
        if action == self.high + 1:
            return "none"
        return str(action + 1)
