"""Correct and deliberately broken RL implementations, one broken class per rule.

``CASES`` pairs each rule id with a call that must fail with it. The classes live at module
level so that the ones meant to pickle can.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
from collections.abc import Callable, Sequence

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
    Trajectory,
)
from tempering_protocols.testing import (
    call_timeout,
    check_env,
    check_env_group_builder,
    check_rl_dataset,
    check_rl_dataset_builder,
)

from .example_env import GuessDataset, GuessDatasetBuilder, GuessGroup

# ---------------------------------------------------------------------------- envs


class OneStepEnv:
    """A correct env: one step, reward 1 when the action starts with token 1."""

    def __init__(self) -> None:
        self.done = False

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.from_ints([5, 6]), [0]

    async def step(self, action: Action, /) -> StepResult:
        if self.done:
            raise RuntimeError("episode over")
        self.done = True
        return StepResult(
            reward=float(action[:1] == [1]),
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=[0],
        )


class MissingStep:
    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.from_ints([5]), [0]


class SyncStep(OneStepEnv):
    def step(self, action: Action, /) -> StepResult:  # pyright: ignore[reportIncompatibleMethodOverride] -- deliberately broken
        return StepResult(1.0, True, tinker.ModelInput.empty(), [0])


class StepNeedsTwoArguments(OneStepEnv):
    async def step(self, action: Action, temperature: float, /) -> StepResult:  # pyright: ignore[reportIncompatibleMethodOverride] -- deliberately broken
        return await super().step(action)


class ResettableEnv(OneStepEnv):
    def reset(self) -> None:
        self.done = False


class ListObservation(OneStepEnv):
    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return [5, 6], [0]  # pyright: ignore[reportReturnType] -- deliberately broken


class DictStepResult(OneStepEnv):
    async def step(self, action: Action, /) -> StepResult:
        await super().step(action)
        return {"reward": 1.0, "episode_done": True}  # pyright: ignore[reportReturnType] -- deliberately broken


class IntEpisodeDone(OneStepEnv):
    async def step(self, action: Action, /) -> StepResult:
        result = await super().step(action)
        return attrs.evolve(result, episode_done=1)


class NanReward(OneStepEnv):
    async def step(self, action: Action, /) -> StepResult:
        return attrs.evolve(await super().step(action), reward=math.nan)


class NeverDone(OneStepEnv):
    async def step(self, action: Action, /) -> StepResult:
        return StepResult(0.0, False, tinker.ModelInput.from_ints(action), [0])


class AcceptsStepAfterDone(OneStepEnv):
    async def step(self, action: Action, /) -> StepResult:
        return StepResult(1.0, True, tinker.ModelInput.empty(), [0])


class StepRaises(OneStepEnv):
    async def step(self, action: Action, /) -> StepResult:
        raise KeyError("no such action")


# ---------------------------------------------------------------------------- builders


@attrs.frozen
class OneStepGroup(EnvGroupBuilder):
    """A correct builder of `size` one-step envs; inherits the protocol's defaults."""

    size: int = 3

    async def make_envs(self) -> Sequence[Env]:
        return [OneStepEnv() for _ in range(self.size)]


@attrs.frozen
class UnpicklableGroup(OneStepGroup):
    make: Callable[[], Env] = attrs.field(factory=lambda: lambda: OneStepEnv())


class CopyMakesFewerEnvs(OneStepGroup):
    def __reduce__(self) -> tuple[type[OneStepGroup], tuple[int]]:
        return (OneStepGroup, (self.size - 1,))


@attrs.frozen
class NotEnvsGroup(OneStepGroup):
    async def make_envs(self) -> Sequence[Env]:
        return [object()]  # pyright: ignore[reportReturnType] -- deliberately broken


@attrs.frozen
class EmptyGroup(OneStepGroup):
    async def make_envs(self) -> Sequence[Env]:
        return []


@attrs.frozen
class SameEnvTwice(OneStepGroup):
    async def make_envs(self) -> Sequence[Env]:
        env = OneStepEnv()
        return [env] * self.size


@attrs.define
class CachedEnvs(EnvGroupBuilder):
    envs: list[Env] = attrs.field(factory=lambda: [OneStepEnv(), OneStepEnv()])

    async def make_envs(self) -> Sequence[Env]:
        return self.envs


@attrs.frozen
class ShortGroupRewards(OneStepGroup):
    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectories_G[1:]]


@attrs.frozen
class BareFloatGroupRewards(OneStepGroup):
    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        return [0.0 for _ in trajectories_G]  # pyright: ignore[reportReturnType] -- deliberately broken


@attrs.frozen
class StringTag(OneStepGroup):
    def logging_tags(self) -> list[str]:
        return "env"  # pyright: ignore[reportReturnType] -- deliberately broken


@attrs.frozen
class MakeEnvsRaises(OneStepGroup):
    async def make_envs(self) -> Sequence[Env]:
        raise FileNotFoundError("tasks.jsonl")


@attrs.frozen
class RecordsCleanup(OneStepGroup):
    """Fails its group rewards; records that cleanup still ran (in a list the test holds)."""

    cleaned: list[str] = attrs.field(factory=list[str])

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        return []

    async def cleanup(self) -> None:
        self.cleaned.append("cleanup")


@attrs.frozen
class GroupOfBadEnvs(OneStepGroup):
    async def make_envs(self) -> Sequence[Env]:
        return [AcceptsStepAfterDone() for _ in range(self.size)]


# ---------------------------------------------------------------------------- datasets


@attrs.frozen
class EmptyDataset(GuessDataset):
    def __len__(self) -> int:
        return 0


@attrs.frozen
class EnvsNotBuilders(GuessDataset):
    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        return [OneStepEnv()]  # pyright: ignore[reportReturnType] -- deliberately broken


@attrs.frozen
class EmptyBatch(GuessDataset):
    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        return []


@attrs.frozen
class CountingDataset(GuessDataset):
    """Each call draws a new secret: not a function of the index."""

    counter: itertools.count[int] = attrs.field(factory=itertools.count)

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        return [GuessGroup(next(self.counter) % 10)]


@attrs.frozen
class GetBatchRaises(GuessDataset):
    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        raise IndexError(index)


@attrs.frozen
class UnpicklableBuilders(GuessDataset):
    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        return [UnpicklableGroup()]


@attrs.frozen
class UnpicklableDatasetBuilder(GuessDatasetBuilder):
    hook: Callable[[], None] = attrs.field(factory=lambda: lambda: None)


@attrs.frozen
class DatasetBuilderReturnsDataset(GuessDatasetBuilder):
    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return GuessDataset()  # pyright: ignore[reportReturnType] -- deliberately broken


@attrs.frozen
class DatasetBuilderRaises(GuessDatasetBuilder):
    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        raise ConnectionError("hub unreachable")


# ---------------------------------------------------------------------------- hangs


async def forever() -> None:
    await asyncio.Event().wait()


class HangingStep(OneStepEnv):
    async def step(self, action: Action, /) -> StepResult:
        await forever()
        raise AssertionError("unreachable")


class HangingMakeEnvs(OneStepGroup):
    async def make_envs(self) -> Sequence[Env]:
        await forever()
        return []


class HangingDatasetBuilder(GuessDatasetBuilder):
    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        await forever()
        raise AssertionError("unreachable")


def quickly(check: Callable[[object], object]) -> Callable[[object], object]:
    """``check`` with a short time limit per awaited call (the hanging cases)."""

    def run(subject: object) -> object:
        with call_timeout(0.2):
            return check(subject)

    return run


# ---------------------------------------------------------------------------- the table

CASES: list[tuple[str, Callable[[], object], Callable[[object], object]]] = [
    # (rule, makes the broken object, the check that must fail with the rule)
    ("protocol/missing-member", MissingStep, check_env),
    ("protocol/async", SyncStep, check_env),
    ("protocol/signature", StepNeedsTwoArguments, check_env),
    ("env/no-reset", ResettableEnv, check_env),
    ("env/initial-observation-type", ListObservation, check_env),
    ("env/step-type", DictStepResult, check_env),
    ("env/step-type", IntEpisodeDone, check_env),
    ("env/reward-not-finite", NanReward, check_env),
    ("env/never-finishes", NeverDone, functools.partial(check_env, max_steps=5)),
    ("env/step-after-done", AcceptsStepAfterDone, check_env),
    ("env/raised", StepRaises, check_env),
    ("builder/pickle", UnpicklableGroup, check_env_group_builder),
    ("builder/pickle", CopyMakesFewerEnvs, check_env_group_builder),
    ("builder/make-envs-type", NotEnvsGroup, check_env_group_builder),
    ("builder/empty-group", EmptyGroup, check_env_group_builder),
    ("builder/fresh-envs", SameEnvTwice, check_env_group_builder),
    ("builder/fresh-envs", CachedEnvs, check_env_group_builder),
    ("builder/group-rewards-length", ShortGroupRewards, check_env_group_builder),
    ("builder/group-rewards-type", BareFloatGroupRewards, check_env_group_builder),
    ("builder/logging-tags-type", StringTag, check_env_group_builder),
    ("builder/raised", MakeEnvsRaises, check_env_group_builder),
    ("env/step-after-done", GroupOfBadEnvs, check_env_group_builder),
    ("rl-dataset/len", EmptyDataset, check_rl_dataset),
    ("rl-dataset/batch-type", EnvsNotBuilders, check_rl_dataset),
    ("rl-dataset/empty-batch", EmptyBatch, check_rl_dataset),
    ("rl-dataset/deterministic", CountingDataset, check_rl_dataset),
    ("rl-dataset/raised", GetBatchRaises, check_rl_dataset),
    ("builder/pickle", UnpicklableBuilders, check_rl_dataset),
    ("rl-dataset-builder/pickle", UnpicklableDatasetBuilder, check_rl_dataset_builder),
    ("rl-dataset-builder/return-type", DatasetBuilderReturnsDataset, check_rl_dataset_builder),
    ("rl-dataset-builder/raised", DatasetBuilderRaises, check_rl_dataset_builder),
    ("env/timeout", HangingStep, quickly(check_env)),
    ("builder/timeout", HangingMakeEnvs, quickly(check_env_group_builder)),
    ("rl-dataset-builder/timeout", HangingDatasetBuilder, quickly(check_rl_dataset_builder)),
]
