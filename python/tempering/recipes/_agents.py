"""What the agent recipes (``tool-use``, ``rubric``, ``twenty-questions``) share: a fixed-list
RL dataset, chat-file writing, playing groups for evaluation, and the RL stage.

Example::

    ds = FixedGroups(builders, batch_size=4, n_batches=30, seed=0)
    trajectories = await play(sampler, test_builders, max_tokens=96, seed=7919)
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from tempering.model_info import resolve_renderer_name
from tempering.recipes._common import (
    TINY_MODEL,
    RecipeResult,
    close_service,
    default_lora_rank,
    finish,
    fresh_model,
)
from tempering.recipes.stages import SFTStage, sft_stage_at
from tempering.renderers import BaseRenderer, get_renderer
from tempering_protocols import (
    EnvGroupBuilder,
    Message,
    RLDatasetBuilder,
    SamplingClient,
    TrainOnWhat,
    Trajectory,
)

if TYPE_CHECKING:
    from tempering.backend import ServiceClient
    from tempering.training import TrainResult

__all__ = ["AgentRecipe", "Evaluate", "FixedGroups", "play", "recipe_renderer", "rl_stage", "write_chats"]

Evaluate = Callable[[str, SamplingClient], Awaitable[dict[str, float]]]
"""``evaluate(stage, sampler)``: the figures of a stage's policy, keys prefixed with ``stage``."""


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


@attrs.frozen(kw_only=True)
class AgentRecipe:
    """The fields and the pipeline the agent recipes share: an SFT warm start on scripted data,
    an evaluation, RL from the SFT checkpoint, the same evaluation. Subclasses set their own
    defaults and run :meth:`sft_then_rl` from ``__call__``."""

    out: str | None = None
    """Run directory (replaced if it exists); default ``runs/<recipe>-<timestamp>``."""
    base_model: str = TINY_MODEL
    renderer_name: str | None = None
    lora_rank: int | None = None
    """LoRA rank; default: full fine-tuning (0) for the tiny model, 32 otherwise."""
    seed: int = 0
    sft_steps: int = 100
    sft_batch_size: int = 16
    sft_learning_rate: float = 1e-3
    rl_steps: int = 4
    rl_batch_size: int = 4
    group_size: int = 4
    rl_learning_rate: float = 1e-4
    max_tokens: int = 32
    """Tokens per reply."""
    progress: bool = True

    def check_positive(self, *names: str) -> None:
        """Raise ``ValueError`` naming the first of these fields (and the shared ones) below 1."""
        shared = ("sft_steps", "sft_batch_size", "rl_steps", "rl_batch_size", "group_size", "max_tokens")
        for name in (*shared, *names):
            if getattr(self, name) < 1:
                raise ValueError(f"{type(self).__name__}: {name} must be >= 1, got {getattr(self, name)}")

    async def sft_then_rl(
        self,
        name: str,
        out: Path,
        service: ServiceClient,
        *,
        train_path: Path,
        test_path: Path,
        make_task: Callable[[TrainResult], Awaitable[tuple[RLDatasetBuilder, Evaluate]]],
        train_on_what: TrainOnWhat = TrainOnWhat.ALL_ASSISTANT_MESSAGES,
        extra: Mapping[str, Any] | None = None,
        t_start: float | None = None,
    ) -> RecipeResult:
        """SFT on ``train_path`` (``<out>/sft``); ``make_task(sft)`` gives the RL task and the
        evaluation; evaluate, RL (``<out>/rl``), evaluate; write the summary (``wall_seconds``
        from ``t_start``, default now)."""
        t_start = time.monotonic() if t_start is None else t_start
        print(f"tempering recipe {name}: SFT, {self.sft_steps} steps -> {out / 'sft'}", flush=True)
        sft = await sft_stage_at(
            out / "sft",
            service=service,
            model=fresh_model(
                self.base_model, self.lora_rank, seed=self.seed, renderer_name=self.renderer_name
            ),
            train_path=train_path,
            test_path=test_path,
            stage=SFTStage(
                self.sft_steps,
                self.sft_batch_size,
                self.sft_learning_rate,
                max_warmup_steps=20,
                train_on_what=train_on_what,
            ),
            seed=self.seed,
            progress=self.progress,
        )
        task, evaluate = await make_task(sft)

        async def stage(label: str, path: str | None) -> dict[str, float]:
            figures = await evaluate(label, await service.create_sampling_client(model_path=path))
            print(f"tempering recipe {name}: after {label.upper()} {figures}", flush=True)
            return figures

        before = await stage("sft", sft.final.sampler_path)
        print(f"tempering recipe {name}: RL, {self.rl_steps} steps -> {out / 'rl'}", flush=True)
        rl = await rl_stage(
            out / "rl",
            service=service,
            task=task,
            base_model=self.base_model,
            renderer_name=self.renderer_name,
            init_state=sft.final.state_path,
            lora_rank=default_lora_rank(self.base_model, self.lora_rank),
            steps=self.rl_steps,
            learning_rate=self.rl_learning_rate,
            max_tokens=self.max_tokens,
            seed=self.seed,
            eval_every=0,
            progress=self.progress,
        )
        after = await stage("rl", rl.final.sampler_path)
        close_service(service)
        figures = {**before, **after, "wall_seconds": time.monotonic() - t_start}
        facts = {
            **(extra or {}),
            "sft_checkpoint": sft.final.sampler_path,
            "rl_checkpoint": rl.final.sampler_path,
        }
        return finish(RecipeResult(name, out, figures, facts), config=self)
