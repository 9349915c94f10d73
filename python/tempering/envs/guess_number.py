"""Guess the number: a multi-turn chat environment with higher/lower feedback.

The env picks a secret in ``low..high``; each turn the policy replies with a number and the env
answers ``"higher"`` (the secret is higher), ``"lower"`` or, on a hit, ends the episode. The
episode also ends after ``max_turns`` guesses or on an invalid reply. The conversation grows
turn by turn, so with a prefix-extending renderer (ChatML) an episode packs into one datum::

    user: Guess a number from 0 to 15.   assistant: 9   user: lower   assistant: 4   user: higher ...

==================================  =========================================================
outcome                             reward (one, at the episode's last step)
==================================  =========================================================
found at turn ``t`` (1-based)       ``1 - turn_cost * (t - 1)``
``max_turns`` guesses, none right   0
invalid reply                       ``invalid_reward`` (default -1): not a plain integer in
                                    ``low..high``, or a reply that does not parse (no stop
                                    token within the turn's token budget)
==================================  =========================================================

Metrics of the last step: ``correct`` (1 when found, so the RL loop's ``env/correct`` is the
success rate), ``guess/found``, ``guess/turns``, ``guess/invalid``; of every step:
``guess/inconsistent`` (1 when a valid guess was already ruled out by earlier feedback, a legal
but wasted turn; absent on an invalid reply).

The rules (range, turns, rewards) are one :class:`GuessNumberRules`, held by the group builder,
the dataset and the task alike. Groups (:class:`GuessNumberGroupBuilder`): ``G`` envs sharing one
secret, so the first turn is one request with ``num_samples = G`` and the group-relative
advantage compares ``G`` attempts at the same secret. :class:`GuessNumberTask` is the RL dataset
builder (every secret of the range, or a seeded split into training and held-out secrets).
:func:`guess_number_stats` summarises finished episodes; :func:`bisect_guess` and
:func:`random_consistent_guess` are scripted players (the recipe's SFT teacher and the baselines).

Shapes: ``P`` secrets per batch, ``G`` envs per secret.

Example::

    rules = GuessNumberRules(low=0, high=15, max_turns=5)
    check_env_group_builder(GuessNumberGroupBuilder(renderer, secret=11, rules=rules, group_size=8))
    train, test = await GuessNumberTask(rules=rules)()
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs
import numpy as np

from tempering.envs.guess_number_play import (
    INTEGER,
    GuessNumberStats,
    GuessPolicy,
    bisect_guess,
    feasible_range,
    guess_number_stats,
    random_consistent_guess,
)
from tempering.envs.message import GameEnvAdapter, MessageStepResult
from tempering.envs.problem import RepeatedEnvGroup
from tempering.envs.task_base import PolicyTask
from tempering_protocols import (
    Env,
    EnvGroupBuilder,
    Message,
    Metrics,
    Renderer,
    RLDataset,
)

__all__ = [
    "GuessNumberDataset",
    "GuessNumberEnv",
    "GuessNumberGame",
    "GuessNumberGroupBuilder",
    "GuessNumberRules",
    "GuessNumberStats",
    "GuessNumberTask",
    "GuessPolicy",
    "bisect_guess",
    "feasible_range",
    "guess_feedback",
    "guess_number_prompt",
    "guess_number_stats",
    "play_scripted",
    "random_consistent_guess",
    "split_secrets",
]


def guess_number_prompt(low: int, high: int) -> str:
    """The first user message of a game."""
    return f"Guess a number from {low} to {high}."


def guess_feedback(secret: int, guess: int) -> str:
    """``"higher"`` when the secret is higher than ``guess``, ``"lower"`` when lower, else
    ``"correct"``."""
    return "higher" if secret > guess else "lower" if secret < guess else "correct"


def _check_range(low: int, high: int, max_turns: int, where: str) -> None:
    if low < 0 or high < low:
        raise ValueError(f"{where}: need 0 <= low <= high, got low={low}, high={high}")
    if max_turns < 1:
        raise ValueError(f"{where}: max_turns must be >= 1, got {max_turns}")


@attrs.define(eq=False)
class GuessNumberGame:
    """One game as a message-level env (:class:`~tempering.envs.MessageEnv`). Single-use.

    Example::

        game = GuessNumberGame(secret=5, low=0, high=15, max_turns=4)
        await game.initial_messages()                       # [user: Guess a number from 0 to 15.]
        (await game.step({"role": "assistant", "content": "8"})).next_messages[-1]   # user: lower
    """

    secret: int
    low: int = attrs.field(default=0, kw_only=True)
    high: int = attrs.field(default=15, kw_only=True)
    max_turns: int = attrs.field(default=5, kw_only=True)
    turn_cost: float = attrs.field(default=0.1, kw_only=True)
    invalid_reward: float = attrs.field(default=-1.0, kw_only=True)
    history: list[Message] = attrs.field(init=False)
    turns: int = attrs.field(init=False, default=0)
    found: bool = attrs.field(init=False, default=False)
    invalid: bool = attrs.field(init=False, default=False)
    done: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        _check_range(self.low, self.high, self.max_turns, "GuessNumberGame")
        if not self.low <= self.secret <= self.high:
            raise ValueError(f"GuessNumberGame: secret {self.secret} is outside {self.low}..{self.high}")
        self.history = [{"role": "user", "content": guess_number_prompt(self.low, self.high)}]

    def _end(self, reward: float, metrics: Metrics) -> MessageStepResult:
        self.done = True
        final: Metrics = {
            "correct": int(self.found),
            "guess/found": int(self.found),
            "guess/turns": self.turns,
            "guess/invalid": int(self.invalid),
        }
        return MessageStepResult(reward=reward, episode_done=True, metrics={**metrics, **final})

    async def initial_messages(self) -> Sequence[Message]:
        return list(self.history)

    async def step(self, message: Message, /) -> MessageStepResult:
        return self.reply(message["content"])

    def unparsed_reply(self, reward: float) -> MessageStepResult:
        """Record a reply that did not parse (counted as an invalid guess) and end the game."""
        if self.done:
            raise RuntimeError("GuessNumberGame is single-use and this episode is over")
        self.turns += 1
        self.invalid = True
        return self._end(reward, {})

    def reply(self, content: str) -> MessageStepResult:
        """:meth:`step` without the wait: answer the assistant's reply ``content``."""
        if self.done:
            raise RuntimeError("GuessNumberGame is single-use and this episode is over")
        self.turns += 1
        text = content.strip()
        guess = int(text) if INTEGER.fullmatch(text) is not None else None
        if guess is None or not self.low <= guess <= self.high:
            self.invalid = True
            return self._end(self.invalid_reward, {})
        lo, hi = feasible_range(self.history, self.low, self.high)
        metrics: Metrics = {"guess/inconsistent": int(not lo <= guess <= hi)}
        answer = guess_feedback(self.secret, guess)
        if answer == "correct":
            self.found = True
            return self._end(1.0 - self.turn_cost * (self.turns - 1), metrics)
        if self.turns >= self.max_turns:
            return self._end(0.0, metrics)
        guessed: Message = {"role": "assistant", "content": text}
        feedback: Message = {"role": "user", "content": answer}
        self.history += [guessed, feedback]
        return MessageStepResult(
            reward=0.0, episode_done=False, next_messages=list(self.history), metrics=metrics
        )


def play_scripted(game: GuessNumberGame, policy: GuessPolicy, rng: random.Random) -> list[Message]:
    """Play ``game`` to its end with a scripted ``policy``; the whole conversation, ending with
    the last guess (the recipe's SFT transcripts).

    Example::

        play_scripted(GuessNumberGame(5), bisect_guess, random.Random(0))
        # [user: Guess a number from 0 to 15., assistant: 7, user: lower, assistant: 3, ...]
    """
    messages = list(game.history)
    while True:
        guess = str(policy(messages, game.low, game.high, rng))
        messages.append({"role": "assistant", "content": guess})
        result = game.reply(guess)
        if result.episode_done:
            return messages
        messages = list(result.next_messages)


class GuessNumberEnv(GameEnvAdapter[GuessNumberGame]):
    """A :class:`GuessNumberGame` through a renderer (token level). A reply that does not parse
    ends the episode with ``invalid_reward`` and the same final metrics as an invalid guess.

    Example::

        env = GuessNumberEnv(GuessNumberGame(secret=5), renderer)
        ob, stop = await env.initial_observation()
    """

    def __init__(self, game: GuessNumberGame, renderer: Renderer) -> None:
        super().__init__(game, renderer, penalty=game.invalid_reward)


@attrs.frozen(kw_only=True)
class GuessNumberRules:
    """The rules of a game: its range, turns and rewards (the module docstring's table).

    Example::

        GuessNumberRules(low=1, high=100, max_turns=7).game(secret=42)
    """

    low: int = 0
    """The smallest secret."""
    high: int = 15
    """The largest secret."""
    max_turns: int = 5
    """Guesses per game."""
    turn_cost: float = 0.1
    """Reward lost per extra guess: a find pays 1 - turn_cost * (guesses - 1)."""
    invalid_reward: float = -1.0
    """Reward of a reply that is not a number from low to high (it ends the game)."""

    def __attrs_post_init__(self) -> None:
        _check_range(self.low, self.high, self.max_turns, "GuessNumberRules")

    def game(self, secret: int) -> GuessNumberGame:
        """A fresh game with ``secret`` under these rules."""
        return GuessNumberGame(
            secret,
            low=self.low,
            high=self.high,
            max_turns=self.max_turns,
            turn_cost=self.turn_cost,
            invalid_reward=self.invalid_reward,
        )


@attrs.frozen
class GuessNumberGroupBuilder(RepeatedEnvGroup):
    """``group_size`` games with one secret. Frozen and small: it pickles (the renderer must).

    Example::

        check_env_group_builder(GuessNumberGroupBuilder(renderer, secret=3, group_size=4))
    """

    renderer: Renderer = attrs.field(eq=False)
    secret: int
    rules: GuessNumberRules = GuessNumberRules()
    group_size: int = 8
    tag: str = "guess_number"

    def __attrs_post_init__(self) -> None:
        low, high = self.rules.low, self.rules.high
        if not low <= self.secret <= high:
            raise ValueError(f"GuessNumberGroupBuilder: secret {self.secret} is outside {low}..{high}")
        if self.group_size < 1:
            raise ValueError(f"GuessNumberGroupBuilder: group_size must be >= 1, got {self.group_size}")

    def game(self) -> GuessNumberGame:
        """A fresh game with this group's secret and rules."""
        return self.rules.game(self.secret)

    def make_env(self) -> Env:
        return GuessNumberEnv(self.game(), self.renderer)


@attrs.frozen
class GuessNumberDataset:
    """``batch_size`` secrets per batch (without repeats when there are enough), each a group of
    ``group_size`` games; batch ``i`` depends only on ``(seed, i)``. ``len`` is ``n_batches``.

    Example::

        ds = GuessNumberDataset((1, 4, 9), renderer, GuessNumberRules(high=9), batch_size=2, n_batches=10)
        builders_P = ds.get_batch(0)
    """

    secrets: tuple[int, ...]
    renderer: Renderer = attrs.field(eq=False)
    rules: GuessNumberRules = GuessNumberRules()
    batch_size: int = 8
    group_size: int = 8
    n_batches: int = 1
    seed: int = 0
    tag: str = "guess_number"

    def __attrs_post_init__(self) -> None:
        if not self.secrets:
            raise ValueError("GuessNumberDataset: secrets is empty")
        if self.batch_size < 1 or self.n_batches < 1:
            raise ValueError(
                "GuessNumberDataset: batch_size and n_batches must be >= 1, "
                f"got batch_size={self.batch_size}, n_batches={self.n_batches}"
            )

    def __len__(self) -> int:
        return self.n_batches

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        rng = random.Random(f"guess-number/{self.seed}/{index}")
        if self.batch_size <= len(self.secrets):
            chosen = rng.sample(self.secrets, self.batch_size)
        else:
            chosen = [rng.choice(self.secrets) for _ in range(self.batch_size)]
        return [
            GuessNumberGroupBuilder(self.renderer, secret, self.rules, self.group_size, self.tag)
            for secret in chosen
        ]


def split_secrets(low: int, high: int, n_test: int, seed: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(train, test)``: the numbers ``low..high`` split by a seeded shuffle, ``n_test`` of them
    held out (``n_test = 0``: every number is a training secret and there is no test set).

    Example::

        train, test = split_secrets(0, 15, n_test=4, seed=0)   # 12 and 4 secrets, disjoint
    """
    numbers = list(range(low, high + 1))
    if not 0 <= n_test < len(numbers):
        raise ValueError(f"n_test_secrets must be in 0..{len(numbers) - 1} for {low}..{high}, got {n_test}")
    order = np.random.default_rng([seed, 0x6E55]).permutation(len(numbers))
    test = tuple(sorted(numbers[int(i)] for i in order[:n_test]))
    train = tuple(sorted(numbers[int(i)] for i in order[n_test:]))
    return train, test


@attrs.frozen(kw_only=True)
class GuessNumberTask(PolicyTask):
    """The RL dataset builder: training secrets (``batch_size`` × ``group_size`` games per step),
    and the held-out secrets (``n_test_secrets``, seeded split; with 0, every secret) ×
    ``test_group_size`` games as the test set, in one batch. Picklable.

    Held-out secrets test more than held-out sampling seeds do: RL rewards naming the training
    secrets, so a policy can learn to avoid numbers it was never rewarded for (measured in
    docs/recipes/guess-number.md).

    Example::

        train, test = await GuessNumberTask(rules=GuessNumberRules(high=9), n_test_secrets=2)()
    """

    rules: GuessNumberRules = GuessNumberRules()
    """The games' range, turns and rewards."""
    n_test_secrets: int = 0
    """Secrets held out as the test set (0: the test set is every secret)."""
    seed: int = 0
    """Seeds the secrets' split and the batch order; the test set samples with seed + 1."""
    batch_size: int = 8
    """Training secrets per batch."""
    group_size: int = 8
    """Games per training secret (one group)."""
    test_group_size: int = 8
    """Games per test secret."""
    n_batches: int = 1000
    """Training batches."""

    def __attrs_post_init__(self) -> None:
        self.secrets()  # validates n_test_secrets

    def secrets(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(train, test)`` secrets."""
        return split_secrets(self.rules.low, self.rules.high, self.n_test_secrets, self.seed)

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        train, test = self.secrets()
        train_ds = GuessNumberDataset(
            train,
            self.renderer(),
            self.rules,
            batch_size=self.batch_size,
            group_size=self.group_size,
            n_batches=self.n_batches,
            seed=self.seed,
        )
        test = test or train  # no held-out secrets: every secret, with the test's own sampling seeds
        return train_ds, attrs.evolve(
            train_ds,
            secrets=test,
            batch_size=len(test),
            group_size=self.test_group_size,
            n_batches=1,
            seed=self.seed + 1,
        )
