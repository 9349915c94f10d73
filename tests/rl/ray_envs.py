"""Envs for the Ray executor's tests and benchmark. A module of its own, so Ray's worker
processes can import it (the tests put this directory on the workers' PYTHONPATH)."""

from __future__ import annotations

import asyncio
import os
import time

import attrs
import tinker

from tempering_protocols import Action, Env, EnvGroupBuilder, Observation, StepResult, StopCondition

STOP = 0


def busy(seconds: float) -> int:
    """About ``seconds`` of pure-Python CPU work (holds the GIL, like a simulator or grader)."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += sum(i * i for i in range(200))
    return n


@attrs.define
class WorkEnv(Env):
    """``turns`` turns; each step costs ``cpu_s`` of CPU work and ``sleep_s`` of waiting. Reward:
    1 when the action starts with 7; the last turn's metrics carry the worker's pid."""

    turns: int = 1
    cpu_s: float = 0.0
    sleep_s: float = 0.0
    t: int = 0

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.from_ints([1, 2]), [STOP]

    async def step(self, action: Action, /) -> StepResult:
        if self.sleep_s:
            await asyncio.sleep(self.sleep_s)
        if self.cpu_s:
            busy(self.cpu_s)
        self.t += 1
        return StepResult(
            reward=float(action[0] == 7),
            episode_done=self.t >= self.turns,
            next_observation=tinker.ModelInput.from_ints([3]),
            next_stop_condition=[STOP],
            metrics={"pid": float(os.getpid())},
        )


@attrs.frozen
class WorkGroup(EnvGroupBuilder):
    """``group_size`` :class:`WorkEnv` members."""

    group_size: int = 2
    turns: int = 1
    cpu_s: float = 0.0
    sleep_s: float = 0.0
    tag: str = "work"

    async def make_envs(self) -> list[Env]:
        return [WorkEnv(self.turns, self.cpu_s, self.sleep_s) for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return [self.tag]


@attrs.define
class RaisingEnv(WorkEnv):
    """Its first step raises."""

    async def step(self, action: Action, /) -> StepResult:
        raise ZeroDivisionError("env bug in a Ray worker")


@attrs.frozen
class RaisingGroup(EnvGroupBuilder):
    """Envs whose first step raises."""

    group_size: int = 2

    async def make_envs(self) -> list[Env]:
        return [RaisingEnv() for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return ["raising"]
