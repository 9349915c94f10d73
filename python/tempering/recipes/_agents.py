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

from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tempering.recipes._common import GroupFlags, RecipeConfig, RecipeResult, recipe_flags
from tempering.recipes.stages import Evaluate, RecipeSession, RLStage, SFTStage, sft_then_rl, stage_field
from tempering_protocols import EnvGroupBuilder, RLDatasetBuilder, SamplingClient, TrainOnWhat, Trajectory

if TYPE_CHECKING:
    from tempering.training import TrainResult

__all__ = ["AgentRecipe", "MakeTask"]

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

    async def play(
        self, sampler: SamplingClient, builders: Sequence[EnvGroupBuilder]
    ) -> list[list[Trajectory]]:
        """Every group of ``builders`` (``eval_samples`` episodes each) played by ``sampler`` at
        temperature 1 with the evaluation's seed: the trajectories of each group, in order."""
        from tempering.rl.evaluate import play_groups
        from tempering.rl.policy import TinkerTokenCompleter

        policy = TinkerTokenCompleter(sampler, self.max_tokens, 1.0)
        played = await play_groups(builders, policy, seed=self.seed + 7919, what=f"{self.NAME} evaluation")
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

        async def task_of(sft: TrainResult | None) -> RLDatasetBuilder:
            task, evaluate = await make_task(sft)
            evaluations.append(evaluate)
            return task

        async def evaluate(stage: str, sampler: SamplingClient) -> dict[str, float]:
            figures = await evaluations[0](stage, sampler)
            s.say(f"after {stage.upper()} {figures}")
            return figures

        run = await sft_then_rl(
            s, self.sft, self.rl, evaluate, train_path=train_path, test_path=test_path, make_task=task_of,
            max_tokens=self.max_tokens,
        )  # fmt: skip
        return s.finish({**(run.before or {}), **run.after}, {**(extra or {}), **run.checkpoints()})
