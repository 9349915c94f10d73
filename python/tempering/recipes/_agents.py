"""What the agent recipes (``tool-use``, ``rubric``, ``twenty-questions``) share: their flags and
their pipeline: an SFT warm start on scripted data, an evaluation, RL from the SFT checkpoint,
the same evaluation (:func:`~tempering.recipes.stages.sft_then_rl`). Their tasks are in the
library (:mod:`tempering.envs.tool_use_task`, :mod:`tempering.envs.rubric_task`,
:mod:`tempering.envs.twenty_questions_task`).

Example::

    @attrs.frozen(kw_only=True)
    class MyAgentRecipe(AgentRecipe):
        NAME: ClassVar[str] = "my-agent"

        async def run(self, s: RecipeSession) -> RecipeResult:
            ...
            return await self.sft_then_rl(s, train_path=train, test_path=test, make_task=make_task)
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tempering.recipes._common import GroupFlags, RecipeConfig, RecipeResult, positive, recipe_flags
from tempering.recipes.stages import Evaluate, RecipeSession, RLStage, SFTStage, sft_then_rl, stage_field
from tempering_protocols import EnvGroupBuilder, RLDatasetBuilder, SamplingClient, TrainOnWhat, Trajectory

if TYPE_CHECKING:
    from tempering.training import TrainResult

__all__ = ["AgentRecipe", "MakeTask", "repeated_figures"]

_EVAL_REPEAT: ContextVar[int] = ContextVar("tempering_agent_eval_repeat", default=0)
"""Which of ``eval_seeds`` evaluations is being played (it offsets :meth:`AgentRecipe.play`'s seed)."""

MakeTask = Callable[["TrainResult | None"], Awaitable[tuple[RLDatasetBuilder, Evaluate[dict[str, float]]]]]
"""``make_task(sft)``: the RL task and the evaluation, given the SFT stage's result."""


def agent_sft(
    steps: int, batch_size: int = 16, train_on_what: TrainOnWhat = TrainOnWhat.ALL_ASSISTANT_MESSAGES
) -> SFTStage:
    """The agent recipes' SFT warm start: ``steps`` steps of ``batch_size`` scripted
    conversations at 2e-3, 20 warmup steps at most, trained on ``train_on_what`` (default: every
    assistant turn)."""
    return SFTStage(steps, batch_size, 2e-3, max_warmup_steps=20, train_on_what=train_on_what)


@recipe_flags(group_size=4, eval_samples=1)
class AgentRecipe(RecipeConfig, GroupFlags):
    """The flags and the pipeline the agent recipes share. Subclasses set their own defaults
    (:func:`~tempering.recipes._common.recipe_flags`, their stages') and ``NAME``, and implement
    :meth:`run`."""

    sft: SFTStage = stage_field(agent_sft(100), required=True)
    """The SFT warm start on scripted data (``--sft.steps`` or ``--sft-steps``, ...)."""
    rl: RLStage = stage_field(RLStage(4, 1e-4, batch_size=4))
    """The RL stage (``--rl.steps`` or ``--rl-steps``, ...)."""
    eval_seeds: int = positive(1)
    """Each evaluation is played this many times, each with its own sampling seed: a figure is
    their mean, and with 2 or more ``<figure>_sd`` is their sample standard deviation."""
    eval_base: bool = False
    """Also evaluate the base model, untrained, before SFT: ``base_`` figures (the same
    held-out items, answerer or judge as the other evaluations)."""

    async def play(
        self, sampler: SamplingClient, builders: Sequence[EnvGroupBuilder]
    ) -> list[list[Trajectory]]:
        """Every group of ``builders`` (``eval_samples`` episodes each) played by ``sampler`` at
        temperature 1 with the evaluation's seed (one per repeat of ``eval_seeds``): the
        trajectories of each group, in order."""
        from tempering.rl.evaluate import play_groups
        from tempering.rl.policy import TinkerTokenCompleter

        policy = TinkerTokenCompleter(sampler, self.max_tokens, 1.0)
        played = await play_groups(
            builders,
            policy,
            seed=self.seed + 7919 + 104729 * _EVAL_REPEAT.get(),
            what=f"{self.NAME} evaluation",
        )
        n: int = self.eval_samples
        return [played[i * n : (i + 1) * n] for i in range(len(builders))]

    async def sft_then_rl(
        self,
        s: RecipeSession,
        *,
        train_path: Path,
        test_path: Path,
        make_task: MakeTask,
        extra: Mapping[str, Any] | None = None,
    ) -> RecipeResult:
        """SFT on ``train_path`` (``<out>/sft``); ``make_task(sft)`` gives the RL task and the
        evaluation; evaluate, RL (``<out>/rl``), evaluate; write the summary."""
        evaluations: list[Evaluate[dict[str, float]]] = []

        base: dict[str, float] = {}

        async def evaluate(stage: str, sampler: SamplingClient) -> dict[str, float]:
            runs: list[dict[str, float]] = []
            for repeat in range(self.eval_seeds):
                token = _EVAL_REPEAT.set(repeat)
                try:
                    runs.append(await evaluations[0](stage, sampler))
                finally:
                    _EVAL_REPEAT.reset(token)
            figures = repeated_figures(runs)
            s.say(
                f"{stage.upper()} model {figures}" if stage == "base" else f"after {stage.upper()} {figures}"
            )
            return figures

        async def task_of(sft: TrainResult | None) -> RLDatasetBuilder:
            task, evaluation = await make_task(sft)
            evaluations.append(evaluation)
            if self.eval_base:
                sampler = await s.service.create_sampling_client(base_model=self.base_model)
                base.update(await evaluate("base", sampler))
            return task

        run = await sft_then_rl(
            s, self.sft, self.rl, evaluate, train_path=train_path, test_path=test_path, make_task=task_of,
            max_tokens=self.max_tokens, log_trajectories=True,
        )  # fmt: skip
        return s.finish({**base, **(run.before or {}), **run.after}, {**(extra or {}), **run.checkpoints()})


def repeated_figures(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The figures of repeated evaluations (same keys in each): the mean of each, and with two
    or more runs ``<key>_sd``, their sample standard deviation.

    Example::

        repeated_figures([{"rl_won": 0.25}, {"rl_won": 0.5}])  # {"rl_won": 0.375, "rl_won_sd": 0.177}
    """
    if not runs:
        raise ValueError("repeated_figures: no evaluation runs (eval_seeds must be >= 1)")
    out: dict[str, float] = {}
    for key in runs[0]:
        values = [run[key] for run in runs]
        out[key] = statistics.fmean(values)
        if len(values) > 1:
            out[f"{key}_sd"] = statistics.stdev(values)
    return out
