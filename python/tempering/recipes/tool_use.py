"""``tempering recipe tool-use``: multi-turn RL with tools: a calculator and BM25 search over a
shipped corpus of fictional towns (``tempering-assets:agents/tool_use_corpus.jsonl``).

Questions, of three kinds, whose answers are numbers no model knows or can work out in its head:

- ``calc``: "What is 73 * 58?" (the calculator);
- ``search``: "How many people live in Lakouk?" (search, then read the number off the result);
- ``both``: "How many years after 1000 was Lakouk founded?" (search, then the calculator).

The towns are split (``test_towns`` held out of SFT and RL), so the evaluation asks about towns
the model never saw: it must use the tools. Reward: 1 when the first number of the final answer
is right, else 0 (also when a budget runs out, :class:`~tempering.envs.tool_use.ToolBudget`).

1. Data: a scripted agent answers ``sft_examples`` training questions with the right tool calls
   and the tools' real results (chat JSONL in ``<out>/data``).
2. SFT (every assistant turn): the tool-call format, which tool for which question, copying the
   arguments and reading the results. Run directory ``<out>/sft``.
3. RL (:func:`tempering.rl.train`) from the SFT checkpoint, ``rl.batch_size`` questions ×
   ``group_size`` episodes a step. Run directory ``<out>/rl``.
4. Evaluation of the SFT and the RL weights on ``eval_questions`` held-out questions per kind,
   ``eval_samples`` episodes each, temperature 1, seeded: accuracy per kind, tool calls and
   budget stops per episode.

Example::

    tempering recipe tool-use                            # defaults: docs/recipes/tool-use.md
    tempering recipe tool-use --sft-steps 20 --rl-steps 2 --out /tmp/tools
"""

from __future__ import annotations

import random
from typing import ClassVar

from tempering.envs.agent_data import write_chats
from tempering.envs.tool_use_task import SYSTEM, ToolUseTask, scripted_episode, tool_use_figures
from tempering.recipes._agents import AgentRecipe, agent_sft
from tempering.recipes._common import RecipeResult, positive, recipe_flags
from tempering.recipes.stages import Evaluate, RecipeSession, RLStage
from tempering_protocols import RLDatasetBuilder, SamplingClient

__all__ = ["ToolUseRecipe"]


@recipe_flags(sft=agent_sft(150), rl=RLStage(8, 1e-4, batch_size=4), max_tokens=96, eval_samples=2)
class ToolUseRecipe(AgentRecipe):
    """Tool use: SFT on scripted tool-using episodes, then multi-turn RL; calling it runs it.
    Figures: docs/recipes/tool-use.md; the test runs a tiny budget."""

    NAME: ClassVar[str] = "tool-use"
    test_towns: int = 15
    """Towns held out of SFT and RL (of 60); the evaluation asks about them."""
    sft_examples: int = positive(600)
    """Scripted tool-using episodes written for the SFT stage."""
    max_turns: int = positive(4)
    """Assistant replies per episode (the turn budget); tool calls are capped at the same number."""
    eval_questions: int = positive(5)
    """Held-out questions per kind."""

    def validate(self) -> None:
        if not 1 <= self.test_towns <= 50:
            raise ValueError(
                f"ToolUseRecipe: test_towns must be in 1..50 (the corpus has 60), got {self.test_towns}"
            )

    def task(self) -> ToolUseTask:
        """The RL task of this config (no test set: the recipe evaluates by itself)."""
        return ToolUseTask(
            base_model=self.base_model, renderer_name=self.renderer_name, batch_size=self.rl.batch_size,
            group_size=self.group_size, eval_samples=self.eval_samples, seed=self.seed,
            test_towns=self.test_towns, eval_questions=self.eval_questions, max_turns=self.max_turns,
            n_batches=self.rl.steps, test=False,
        )  # fmt: skip

    async def run(self, s: RecipeSession) -> RecipeResult:
        from tempering.tools import tool_prefix

        task = self.task()
        train, test = task.split()
        index, tools = task.tools()
        prefix = tool_prefix(self.renderer(), tools, SYSTEM)
        rng = random.Random(f"tool-use-sft/{self.seed}")
        episodes = [[*prefix, *scripted_episode(rng.choice(train), index)] for _ in range(self.sft_examples)]
        train_path = write_chats(s.run_dir / "data" / "train.jsonl", episodes)
        test_rows = [[*prefix, *scripted_episode(q, index)] for q in test]
        test_path = write_chats(s.run_dir / "data" / "test.jsonl", test_rows)
        eval_builders = task.builders(test, self.eval_samples)

        async def evaluate(stage: str, sampler: SamplingClient) -> dict[str, float]:
            return tool_use_figures(stage, eval_builders, await self.play(sampler, eval_builders))

        async def make_task(sft: object) -> tuple[RLDatasetBuilder, Evaluate[dict[str, float]]]:
            return task, evaluate

        extra = {"eval_episodes": len(test) * self.eval_samples}
        return await self.sft_then_rl(
            s, train_path=train_path, test_path=test_path, make_task=make_task, extra=extra
        )
