"""Envs that misbehave, for the fault tests (importable by spawned env workers: module level,
picklable): slow, endless, hanging, empty groups and bad rewards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import attrs
import tinker

from tempering_protocols import (
    Action,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    StepResult,
    StopCondition,
    Trajectory,
)

PROMPT = tinker.ModelInput.from_ints([1, 2, 3])


@attrs.define
class MisbehavingEnv(Env):
    """``mode``: ``"sleep"`` (``step`` blocks ``seconds`` with ``time.sleep``), ``"async-sleep"``,
    ``"endless"`` (never done), ``"hang"`` (``initial_observation`` awaits forever),
    ``"hang-step"``, ``"nan"`` / ``"str"`` (rewards NaN / ``"1.0"``), ``"ok"``."""

    mode: str
    seconds: float = 5.0
    done: bool = False

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        if self.mode == "hang":
            await asyncio.Event().wait()
        return PROMPT, [0]

    async def step(self, action: Action, /) -> StepResult:
        if self.done:
            raise RuntimeError("episode over")
        self.done = self.mode != "endless"
        if self.mode == "sleep":
            time.sleep(self.seconds)
        elif self.mode == "async-sleep":
            await asyncio.sleep(self.seconds)
        elif self.mode == "hang-step":
            await asyncio.Event().wait()
        reward: object = 1.0
        if self.mode == "nan":
            reward = float("nan")
        elif self.mode == "str":
            reward = "1.0"
        return StepResult(
            reward=reward,  # pyright: ignore[reportArgumentType]
            episode_done=self.mode != "endless",
            next_observation=PROMPT,
            next_stop_condition=[0],
        )


@attrs.define
class MisbehavingGroup(EnvGroupBuilder):
    mode: str
    group_size: int = 2
    seconds: float = 5.0
    empty: bool = False

    async def make_envs(self) -> Sequence[Env]:
        if self.empty:
            return []
        return [MisbehavingEnv(self.mode, self.seconds) for _ in range(self.group_size)]

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectories_G]

    def logging_tags(self) -> list[str]:
        return [self.mode]


@attrs.define
class MisbehavingDataset:
    """``n_batches`` batches of ``batch_size`` :class:`MisbehavingGroup` s of ``mode``."""

    mode: str
    batch_size: int
    group_size: int
    n_batches: int

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        return [MisbehavingGroup(self.mode, self.group_size) for _ in range(self.batch_size)]

    def __len__(self) -> int:
        return self.n_batches


@attrs.define
class MisbehavingDatasetBuilder:
    """An RL dataset builder for ``tempering rl --dataset-builder faults_envs:MisbehavingDatasetBuilder``."""

    mode: str = "nan"
    batch_size: int = 2
    group_size: int = 2
    n_batches: int = 2

    async def __call__(self) -> tuple[MisbehavingDataset, None]:
        return MisbehavingDataset(self.mode, self.batch_size, self.group_size, self.n_batches), None
