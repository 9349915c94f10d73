"""What the agent recipes (``tool-use``, ``rubric``, ``twenty-questions``) share: a fixed-list
RL dataset, chat-file writing, playing groups for evaluation, and the RL stage.

Example::

    ds = FixedGroups(builders, batch_size=4, n_batches=30, seed=0)
    trajectories = await play(sampler, test_builders, max_tokens=96, seed=7919)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tempering.model_info import resolve_renderer_name
from tempering.renderers import BaseRenderer, get_renderer
from tempering_protocols import EnvGroupBuilder, Message, RLDatasetBuilder, SamplingClient, Trajectory

if TYPE_CHECKING:
    from tempering.backend import ServiceClient
    from tempering.training import TrainResult

__all__ = ["FixedGroups", "play", "recipe_renderer", "rl_stage", "write_chats"]


def recipe_renderer(base_model: str, renderer_name: str | None) -> BaseRenderer:
    """The renderer of ``base_model`` (``renderer_name`` if given, else its recommended one)."""
    from tempering.backend import load_tokenizer

    return get_renderer(resolve_renderer_name(base_model, renderer_name), load_tokenizer(base_model))


class FixedGroups:
    """An ``RLDataset`` over a fixed list of builders: ``n_batches`` batches of ``batch_size``,
    drawn in a seeded order (a fresh permutation each pass over the list)."""

    def __init__(
        self, builders: Sequence[EnvGroupBuilder], *, batch_size: int, n_batches: int, seed: int
    ) -> None:
        if not builders:
            raise ValueError("FixedGroups: no builders")
        self.builders = list(builders)
        self.batch_size = batch_size
        self.n_batches = n_batches
        n = len(self.builders)
        passes = -(-(batch_size * n_batches) // n)
        self._order = np.concatenate([np.random.default_rng([seed, p]).permutation(n) for p in range(passes)])

    def __len__(self) -> int:
        return self.n_batches

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        picks = self._order[index * self.batch_size : (index + 1) * self.batch_size]
        return [self.builders[int(i)] for i in picks]


def write_chats(path: Path, conversations: Sequence[Sequence[Message]]) -> Path:
    """Write ``{"messages": [...]}`` rows; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for messages in conversations:
            f.write(json.dumps({"messages": list(messages)}) + "\n")
    return path


async def play(
    sampler: SamplingClient,
    builders: Sequence[EnvGroupBuilder],
    *,
    max_tokens: int,
    seed: int,
    temperature: float = 1.0,
) -> list[list[Trajectory]]:
    """Play every group of ``builders`` with ``sampler`` (seeded): the trajectories of each group,
    in builder order. Raises when an episode failed (a bug, not a bad reply)."""
    from tempering.rl.policy import TinkerTokenCompleter
    from tempering.rl.rollouts import RolloutConfig, rollout_batch

    policy = TinkerTokenCompleter(sampler, max_tokens, temperature)
    rollouts = await rollout_batch(builders, policy, RolloutConfig(), seed=seed)
    failed = [r.failures for r in rollouts if r.n_failed]
    if failed:
        raise RuntimeError(f"evaluation: episodes failed: {failed}")
    return [list(r.group.trajectories_G) if r.group is not None else [] for r in rollouts]


async def rl_stage(
    run_dir: Path,
    *,
    service: ServiceClient,
    task: RLDatasetBuilder,
    base_model: str,
    renderer_name: str | None,
    init_state: str | None,
    lora_rank: int,
    steps: int,
    learning_rate: float,
    max_tokens: int,
    seed: int,
    eval_every: int,
    progress: bool,
) -> TrainResult:
    """``steps`` steps of :func:`tempering.rl.train` on ``task`` from ``init_state`` (Adam,
    ``beta2=0.98``, constant learning rate), logged to ``run_dir``."""
    from tempering.backend import ModelConfig
    from tempering.rl import RLConfig, train
    from tempering.training import AdamConfig, LRSchedule, RunConfig

    config = RLConfig(
        run=RunConfig(
            log_dir=str(run_dir),
            if_exists="overwrite",
            save_every=0,
            eval_every=eval_every,
            progress=progress,
        ),
        dataset=task,
        model=ModelConfig(
            base_model=base_model,
            init_state=init_state,
            renderer_name=renderer_name,
            lora_rank=lora_rank,
            seed=seed,
        ),
        adam=AdamConfig(learning_rate=learning_rate, beta2=0.98, schedule=LRSchedule("constant")),
        num_steps=steps,
        max_tokens=max_tokens,
        temperature=1.0,
        seed=seed,
    )
    return await train(config, service=service)
