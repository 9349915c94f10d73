"""The built-in in-context tasks and their source learners (``tempering_protocols.incontext``).

- :class:`BanditFamily`: Bernoulli ``k``-armed bandits, one pull per episode; arm probabilities
  uniform in ``[0, 1]`` per task. Sources: Thompson sampling (Beta(1, 1) priors), UCB1,
  ε-greedy.
- :class:`DarkRoomFamily`: a ``size × size`` grid, the agent starts in the centre, a hidden goal
  per task; observation = position; reward 1 for every step that ends on the goal; ``horizon``
  steps per episode; actions: stay, up, down, left, right. Held-out tasks: every
  ``held_out_every``-th goal cell is never trained on. Source: tabular Q-learning, ε-greedy,
  with optimistic values for untried actions and every stored transition replayed after each
  episode (Dyna-style), so it finds and then exploits the goal within a few episodes.
- :class:`GuessNumberFamily`: the guess-number game with the hidden number fixed per task
  across episodes; state = the last feedback (start, higher, lower, correct), action = a guess;
  reward 1 per correct guess. Source: a scripted learner (binary search, then it remembers).

Example::

    family = DarkRoomFamily(size=9, horizon=20)
    task = family.task(4, False)
    learner = family.learner(task, 4)
"""

from __future__ import annotations

import math
from typing import Literal

import attrs
import numpy as np

from tempering_protocols import InContextTask, SourceLearner

__all__ = [
    "BanditFamily",
    "BanditTask",
    "DarkRoomFamily",
    "DarkRoomTask",
    "GuessNumberFamily",
    "GuessNumberTask",
]

BanditSource = Literal["thompson", "ucb", "epsilon-greedy", "oracle"]


def _rng(*seeds: int) -> np.random.Generator:
    return np.random.default_rng([abs(s) for s in seeds] + [int(s < 0) for s in seeds])


# ------------------------------------------------------------------------------------- bandits


class BanditTask:
    """Arms with success probabilities ``probs_K``; the state is always 0."""

    def __init__(self, probs_K: np.ndarray, rng: np.random.Generator) -> None:
        self.probs_K = probs_K
        self._rng = rng

    def reset(self) -> int:
        return 0

    def step(self, action: int, /) -> tuple[int, float]:
        return 0, float(self._rng.random() < self.probs_K[action])

    def optimal_return(self) -> float:
        return float(self.probs_K.max())

    def expected_reward(self, action: int) -> float:
        return float(self.probs_K[action])


class _BanditLearner:
    """Thompson sampling, UCB1 or ε-greedy on counts of successes and failures."""

    def __init__(self, k: int, kind: BanditSource, epsilon: float, rng: np.random.Generator) -> None:
        self.kind = kind
        self.epsilon = epsilon
        self.wins_K = np.zeros(k)
        self.pulls_K = np.zeros(k)
        self._rng = rng

    def act(self, state: int, /) -> tuple[int, float]:
        k = len(self.pulls_K)
        if self.kind == "thompson":
            # the probability of each arm being chosen, estimated from 256 posterior draws
            draws_NK = self._rng.beta(1 + self.wins_K, 1 + self.pulls_K - self.wins_K, size=(256, k))
            probs_K = np.bincount(draws_NK.argmax(axis=1), minlength=k) / 256.0
            sample_K = self._rng.beta(1 + self.wins_K, 1 + self.pulls_K - self.wins_K)
            action = int(sample_K.argmax())
            return action, math.log(max(float(probs_K[action]), 1.0 / 256))
        if self.kind == "ucb":
            if (self.pulls_K == 0).any():
                untried = np.flatnonzero(self.pulls_K == 0)
                return int(untried[0]), 0.0
            t = self.pulls_K.sum()
            score_K = self.wins_K / self.pulls_K + np.sqrt(2 * math.log(t) / self.pulls_K)
            return int(score_K.argmax()), 0.0
        mean_K = np.where(self.pulls_K > 0, self.wins_K / np.maximum(self.pulls_K, 1), 1.0)
        greedy = int(mean_K.argmax())
        action = int(self._rng.integers(k)) if self._rng.random() < self.epsilon else greedy
        p = self.epsilon / k + (1 - self.epsilon) * (action == greedy)
        return action, math.log(p)

    def update(self, state: int, action: int, reward: float, next_state: int, done: bool, /) -> None:
        self.pulls_K[action] += 1
        self.wins_K[action] += reward


class _BanditOracle:
    """The expert: always the arm of highest probability (log-probability 0); learns nothing."""

    def __init__(self, best: int) -> None:
        self.best = best

    def act(self, state: int, /) -> tuple[int, float]:
        return self.best, 0.0

    def update(self, state: int, action: int, reward: float, next_state: int, done: bool, /) -> None:
        pass


@attrs.frozen(kw_only=True)
class BanditFamily:
    """Bernoulli bandits with ``n_arms`` arms (one pull per episode); see the module docstring.

    Example::

        BanditFamily(n_arms=5, source="thompson").task(0, False).probs_K
    """

    n_arms: int = 5
    source: BanditSource = "thompson"
    epsilon: float = 0.1
    """ε of the ε-greedy source."""

    def __attrs_post_init__(self) -> None:
        if self.n_arms < 2:
            raise ValueError(f"BanditFamily.n_arms must be >= 2, got {self.n_arms}")

    @property
    def name(self) -> str:
        return "bandit"

    @property
    def n_states(self) -> int:
        return 1

    @property
    def n_actions(self) -> int:
        return self.n_arms

    @property
    def horizon(self) -> int:
        return 1

    def task(self, seed: int, held_out: bool, /) -> BanditTask:
        rng = _rng(seed, 1 if held_out else 0, 11)
        return BanditTask(rng.random(self.n_arms), rng)

    def learner(self, task: InContextTask, seed: int, /) -> SourceLearner:
        if self.source == "oracle":
            if not isinstance(task, BanditTask):
                raise TypeError(
                    f"BanditFamily(source='oracle'): needs a BanditTask, got {type(task).__name__}"
                )
            return _BanditOracle(int(task.probs_K.argmax()))
        return _BanditLearner(self.n_arms, self.source, self.epsilon, _rng(seed, 12))

    def describe_state(self, state: int, /) -> str:
        return "pull an arm"

    def describe_action(self, action: int, /) -> str:
        return f"arm {action}"


# ------------------------------------------------------------------------------------ dark room

_MOVES = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))
_MOVE_NAMES = ("stay", "up", "down", "left", "right")


class DarkRoomTask:
    """A ``size × size`` grid with a hidden goal; state = ``row * size + col``."""

    def __init__(self, size: int, horizon: int, goal: int) -> None:
        self.size = size
        self.horizon = horizon
        self.goal = goal
        self.start = (size // 2) * size + size // 2
        self._pos = self.start

    def reset(self) -> int:
        self._pos = self.start
        return self._pos

    def step(self, action: int, /) -> tuple[int, float]:
        row, col = divmod(self._pos, self.size)
        dr, dc = _MOVES[action]
        row = min(max(row + dr, 0), self.size - 1)
        col = min(max(col + dc, 0), self.size - 1)
        self._pos = row * self.size + col
        return self._pos, float(self._pos == self.goal)

    def optimal_return(self) -> float:
        (r0, c0), (r1, c1) = divmod(self.start, self.size), divmod(self.goal, self.size)
        distance = abs(r0 - r1) + abs(c0 - c1)
        return float(self.horizon if distance == 0 else max(0, self.horizon - distance + 1))


class _QLearner:
    """Tabular Q-learning: ε-greedy, optimistic values for untried actions, and after each
    episode ``sweeps`` replays of every stored transition (deterministic dynamics)."""

    def __init__(
        self, n_states: int, n_actions: int, *, gamma: float, epsilon: float, sweeps: int,
        optimism: float, rng: np.random.Generator,
    ) -> None:  # fmt: skip
        self.q_SA = np.zeros((n_states, n_actions))
        self.tried_SA = np.zeros((n_states, n_actions), dtype=bool)
        self.gamma = gamma
        self.epsilon = epsilon
        self.sweeps = sweeps
        self.optimism = optimism
        self.model: dict[tuple[int, int], tuple[float, int]] = {}
        self._rng = rng

    def _values(self, state: int) -> np.ndarray:
        return np.where(self.tried_SA[state], self.q_SA[state], self.optimism)

    def act(self, state: int, /) -> tuple[int, float]:
        values_A = self._values(state)
        best_A = np.flatnonzero(values_A >= values_A.max() - 1e-9)
        n = len(values_A)
        probs_A = np.full(n, self.epsilon / n)
        probs_A[best_A] += (1 - self.epsilon) / len(best_A)
        action = int(self._rng.choice(n, p=probs_A))
        return action, math.log(float(probs_A[action]))

    def update(self, state: int, action: int, reward: float, next_state: int, done: bool, /) -> None:
        self.model[(state, action)] = (reward, next_state)
        self.tried_SA[state, action] = True
        self._backup(state, action, reward, next_state)
        if done:
            for _ in range(self.sweeps):
                for (s, a), (r, s2) in self.model.items():
                    self._backup(s, a, r, s2)

    def _backup(self, s: int, a: int, r: float, s2: int) -> None:
        self.q_SA[s, a] = r + self.gamma * float(self._values(s2).max())


@attrs.frozen(kw_only=True)
class DarkRoomFamily:
    """Dark Room (see the module docstring); the goals of the held-out split are the cells
    ``i`` with ``i % held_out_every == held_out_every - 1``.

    Example::

        DarkRoomFamily(size=9, horizon=20).task(0, True).goal
    """

    size: int = 9
    horizon: int = 20
    held_out_every: int = 5
    epsilon: float = 0.1
    """ε of the Q-learner."""
    sweeps: int = 10
    """Replays of the stored transitions after each episode."""
    gamma: float = 0.9
    optimism: float = 1.0
    """The value of an untried action (R-max style exploration)."""

    def __attrs_post_init__(self) -> None:
        if self.size < 2 or self.horizon < 1 or self.held_out_every < 2:
            raise ValueError(
                f"DarkRoomFamily: size must be >= 2, horizon >= 1, held_out_every >= 2; got "
                f"{self.size}, {self.horizon}, {self.held_out_every}"
            )

    @property
    def name(self) -> str:
        return "darkroom"

    @property
    def n_states(self) -> int:
        return self.size * self.size

    @property
    def n_actions(self) -> int:
        return len(_MOVES)

    def goals(self, held_out: bool) -> list[int]:
        """The goal cells of one split."""
        k = self.held_out_every
        return [i for i in range(self.n_states) if (i % k == k - 1) == held_out]

    def task(self, seed: int, held_out: bool, /) -> DarkRoomTask:
        goals = self.goals(held_out)
        return DarkRoomTask(self.size, self.horizon, goals[seed % len(goals)])

    def learner(self, task: InContextTask, seed: int, /) -> SourceLearner:
        return _QLearner(
            self.n_states, self.n_actions, gamma=self.gamma, epsilon=self.epsilon, sweeps=self.sweeps,
            optimism=self.optimism, rng=_rng(seed, 21),
        )  # fmt: skip

    def describe_state(self, state: int, /) -> str:
        """The cell as ``(row,col)``: 5 characters, so that a window of 2 episodes fits the tiny
        model's context as a transcript (docs/recipes/algorithm-distillation.md, "Dark Room in
        the language format")."""
        row, col = divmod(state, self.size)
        return f"({row},{col})"

    def describe_action(self, action: int, /) -> str:
        return _MOVE_NAMES[action]


# --------------------------------------------------------------------------------- guess number

_FEEDBACK = ("start", "higher", "lower", "correct")


class GuessNumberTask:
    """A hidden number in ``1..high``; state = the feedback on the last guess."""

    def __init__(self, high: int, horizon: int, secret: int) -> None:
        self.high = high
        self.horizon = horizon
        self.secret = secret

    def reset(self) -> int:
        return 0

    def step(self, action: int, /) -> tuple[int, float]:
        guess = action + 1
        if guess == self.secret:
            return 3, 1.0
        return (1 if self.secret > guess else 2), 0.0

    def optimal_return(self) -> float:
        return float(self.horizon)


class _ScriptedGuesser:
    """Binary search within an episode; the number, once found, is remembered across episodes."""

    def __init__(self, high: int) -> None:
        self.high = high
        self.known: int | None = None
        self.lo, self.hi = 1, high
        self.last = 0

    def act(self, state: int, /) -> tuple[int, float]:
        if self.known is not None:
            return self.known - 1, 0.0
        self.last = (self.lo + self.hi) // 2
        return self.last - 1, 0.0

    def update(self, state: int, action: int, reward: float, next_state: int, done: bool, /) -> None:
        guess = action + 1
        if next_state == 3:
            self.known = guess
        elif next_state == 1:
            self.lo = guess + 1
        else:
            self.hi = guess - 1
        if done:
            self.lo, self.hi = 1, self.high


@attrs.frozen(kw_only=True)
class GuessNumberFamily:
    """Guess a number in ``1..high`` within ``horizon`` guesses per episode, the number
    fixed across the task's episodes; held-out tasks: the odd numbers.

    Example::

        GuessNumberFamily(high=16).task(0, False).secret
    """

    high: int = 16
    horizon: int = 6

    @property
    def name(self) -> str:
        return "guess-number"

    @property
    def n_states(self) -> int:
        return len(_FEEDBACK)

    @property
    def n_actions(self) -> int:
        return self.high

    def task(self, seed: int, held_out: bool, /) -> GuessNumberTask:
        numbers = [n for n in range(1, self.high + 1) if (n % 2 == 1) == held_out]
        return GuessNumberTask(self.high, self.horizon, numbers[seed % len(numbers)])

    def learner(self, task: InContextTask, seed: int, /) -> SourceLearner:
        return _ScriptedGuesser(self.high)

    def describe_state(self, state: int, /) -> str:
        return _FEEDBACK[state]

    def describe_action(self, action: int, /) -> str:
        return str(action + 1)
