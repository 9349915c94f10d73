"""Guess the digit: a complete small RL task written against the tempering protocols.

Token ids 0-9 stand for the digits, so no tokenizer is needed. The policy guesses; after a
wrong guess the env answers HIGHER or LOWER and the policy guesses again, up to `max_turns`.
A correct guess earns reward 1; the group adds a bonus for the fastest solvers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import attrs
import tinker

from tempering_protocols import (
    Action,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    RLDataset,
    StepResult,
    StopCondition,
    TokensWithLogprobs,
    Trajectory,
)

PROMPT, HIGHER, LOWER, END = 10, 11, 12, 13  # "guess a digit", feedback tokens, end of a guess


@attrs.define
class GuessEnv(Env):
    """One episode: guess `secret` in at most `max_turns` tries. Single-use."""

    secret: int
    max_turns: int = 4
    context: list[int] = attrs.field(factory=lambda: [PROMPT], init=False)
    turns: int = attrs.field(default=0, init=False)
    done: bool = attrs.field(default=False, init=False)

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.from_ints(self.context), [END]

    async def step(self, action: Action, /) -> StepResult:
        if self.done:
            raise RuntimeError("GuessEnv is single-use and this episode is over")
        self.turns += 1
        guess = next((token for token in action if 0 <= token <= 9), None)
        correct = guess == self.secret
        self.done = correct or self.turns >= self.max_turns
        feedback = HIGHER if guess is None or guess < self.secret else LOWER
        # The next observation is the whole context so far: prompt, guesses and feedback.
        self.context = [*self.context, *action, *([] if self.done else [feedback])]
        return StepResult(
            reward=float(correct),
            episode_done=self.done,
            next_observation=tinker.ModelInput.from_ints(self.context),
            next_stop_condition=[END],
            metrics={"guess/turns": self.turns},
        )


@attrs.frozen
class GuessGroup(EnvGroupBuilder):
    """`group_size` envs with the same secret. Frozen and small, so it pickles."""

    secret: int
    group_size: int = 4

    async def make_envs(self) -> Sequence[Env]:
        return [GuessEnv(self.secret) for _ in range(self.group_size)]

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        """A bonus of 0.5 for the members that solved it in the fewest turns."""
        turns_G = [len(t.transitions) if t.total_reward > 0 else math.inf for t in trajectories_G]
        fastest = min(turns_G)
        return [
            (0.5 if turns == fastest < math.inf else 0.0, {"guess/fastest": float(turns == fastest)})
            for turns in turns_G
        ]

    def logging_tags(self) -> list[str]:
        return ["guess"]


@attrs.frozen
class GuessDataset:
    """`n_batches` batches of `batch_size` groups; batch `i` depends only on (`seed`, `i`)."""

    batch_size: int = 2
    n_batches: int = 8
    group_size: int = 4
    seed: int = 0

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        rng = random.Random(f"{self.seed}/{index}")
        return [GuessGroup(rng.randrange(10), self.group_size) for _ in range(self.batch_size)]

    def __len__(self) -> int:
        return self.n_batches


@attrs.frozen
class GuessDatasetBuilder:
    """The serializable config: builds the train dataset and a one-batch test dataset."""

    batch_size: int = 2
    group_size: int = 4
    seed: int = 0

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        train = GuessDataset(self.batch_size, n_batches=8, group_size=self.group_size, seed=self.seed)
        test = GuessDataset(self.batch_size, n_batches=1, group_size=self.group_size, seed=self.seed + 1)
        return train, test


def bisect_actions(observation: Observation, stop: StopCondition, /) -> Action:
    """An action policy for the conformance kit that plays well: binary search on the feedback."""
    low, high, last = 0, 9, None
    for token in observation.to_ints():
        if 0 <= token <= 9:
            last = token
        elif token == HIGHER and last is not None:
            low = last + 1
        elif token == LOWER and last is not None:
            high = last - 1
    return [(low + high) // 2, END]


@attrs.frozen
class UniformGuesser:
    """A `TokenCompleter`: guesses a digit uniformly at random, with its true logprob."""

    seed: int = 0

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        digit = random.Random(f"{self.seed}/{model_input.length}").randrange(10)
        return TokensWithLogprobs(tokens=[digit, END], maybe_logprobs=[math.log(0.1), 0.0])
