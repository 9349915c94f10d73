"""Client-side overhead of one RL training step on W1-sized batches.

W1 shape: ``P = 64`` problems × ``G = 16`` samples, prompts of 256 tokens, completions of 64..1024
tokens (uniform), single-turn envs graded in Python. The backend is a fake
(``tests/fake_backend.py``, a backend with its own capabilities) whose every request completes at
once (sampling returns pre-drawn completions with logprobs; ``forward_backward`` returns per-datum
logprobs; ``optim_step`` returns at once), so the measured step time is the loop's own work:
rollouts (env calls, the shared-first-turn request per group), advantages and packing on the Rust
core, datums, loss-input stripping, diagnostics, metrics and bookkeeping.

Group ``rl-step``: the full loop step (``train`` with the fake backend) beside its baseline,
the data path alone (``compute_advantages`` + ``trajectories_to_batch`` + ``to_datums`` on the
same groups). ``extra_info`` records the per-step overhead in seconds and tokens per step.
See docs/benchmarks.md, "RL loop".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import pytest
import tinker
from fake_backend import FakeSampler, FakeService  # pyright: ignore[reportMissingImports]  # tests/
from pytest_benchmark.fixture import BenchmarkFixture

from tempering.backend import ModelConfig
from tempering.rl.data import compute_advantages, trajectories_to_batch
from tempering.rl.policy import TinkerTokenCompleter
from tempering.rl.rollouts import RolloutConfig, rollout_batch
from tempering.rl.train import RLConfig, train
from tempering.training import AdamConfig, RunConfig
from tempering_protocols import (
    Action,
    Env,
    EnvGroupBuilder,
    Observation,
    RLDataset,
    StepResult,
    StopCondition,
)

P, G, PROMPT, MIN_COMPLETION, MAX_COMPLETION = 64, 16, 256, 64, 1024
STEPS = 3


class AnswerEnv(Env):
    def __init__(self, prompt: list[int]) -> None:
        self.prompt = prompt

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker.ModelInput.from_ints(self.prompt), [0]

    async def step(self, action: Action, /) -> StepResult:
        return StepResult(
            reward=float(len(action) % 2),
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=[0],
            metrics={"correct": float(len(action) % 2)},
        )


@attrs.frozen
class AnswerGroup(EnvGroupBuilder):
    seed: int

    async def make_envs(self) -> Sequence[Env]:
        prompt = np.random.default_rng(self.seed).integers(0, 256, PROMPT).tolist()
        return [AnswerEnv(prompt) for _ in range(G)]


@attrs.frozen
class W1Dataset:
    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        return [AnswerGroup(index * P + p) for p in range(P)]

    def __len__(self) -> int:
        return 1000


@attrs.frozen
class W1:
    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return W1Dataset(), None


def _loop_step_seconds(log_dir: Path) -> tuple[float, dict[str, float]]:
    config = RLConfig(
        run=RunConfig(
            log_dir=str(log_dir), if_exists="overwrite", save_every=0, eval_every=0, progress=False
        ),
        dataset=W1(),
        model=ModelConfig(),
        adam=AdamConfig(learning_rate=1e-5),
        num_steps=STEPS,
        rollout=RolloutConfig(),
    )
    t0 = time.perf_counter()
    result = asyncio.run(train(config, service=FakeService((MIN_COMPLETION, MAX_COMPLETION))))  # type: ignore[arg-type]
    total = time.perf_counter() - t0
    last = {k: float(v) for k, v in result.metrics[-1].items() if isinstance(v, int | float)}
    return total / STEPS, last


@pytest.mark.benchmark(group="rl-step")
def test_rl_loop_step_overhead(benchmark: BenchmarkFixture, tmp_path: Path) -> None:
    per_step, last = benchmark.pedantic(lambda: _loop_step_seconds(tmp_path / "run"), rounds=1, iterations=1)
    benchmark.extra_info.update(
        seconds_per_step=per_step,
        tokens_sampled=last["tokens/sampled"],
        tokens_trained=last["tokens/trained"],
        **{k: v for k, v in last.items() if k.startswith("time/")},
    )
    print(f"\nRL loop client overhead: {per_step:.3f} s/step; {last}")
    assert last["tokens/trained"] > 0.5 * P * G * MIN_COMPLETION


@pytest.mark.benchmark(group="rl-step")
def test_rl_data_path_baseline(benchmark: BenchmarkFixture) -> None:
    sampler = FakeSampler(np.random.default_rng(0), (MIN_COMPLETION, MAX_COMPLETION))
    policy = TinkerTokenCompleter(sampler, max_tokens=MAX_COMPLETION)  # type: ignore[arg-type]
    rollouts = asyncio.run(rollout_batch(W1Dataset().get_batch(0), policy, RolloutConfig()))
    groups = [r.group for r in rollouts if r.group is not None]

    def data_path() -> int:
        batch = trajectories_to_batch(groups, compute_advantages(groups))
        return len(batch.to_datums())

    assert benchmark(data_path) == P * G
