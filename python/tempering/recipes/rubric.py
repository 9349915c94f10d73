"""``tempering recipe rubric``: RL against an LLM judge's rubric score.

The policy answers the shipped arithmetic and word questions (``arithmetic_chat*.jsonl``); an
LLM judge (:class:`~tempering.envs.judge.LLMJudge`) grades each reply by a rubric against the
reference answer and ends with ``Score: N`` (0..10); the reward is ``N / 10``. A verdict with no
score, or none in ``judge_timeout_s``, gives no reward, masks the turn, and is counted.

1. The judge: on the local engine the tiny model knows no rubric, so it is trained first, by SFT
   on ``judge_examples`` scripted verdicts (a reply equal to the reference scores 10, any other
   0; half the replies are right), run directory ``<out>/judge``. With ``--judge-sft-steps 0``
   the judge is ``--judge-model``'s base weights as they are (a large hosted model).
2. The policy: SFT on the shipped chats (``<out>/sft``), then RL from there against the judge
   (``<out>/rl``), ``rl.batch_size`` questions × ``group_size`` replies a step.
3. Evaluation of the SFT and RL policies on the held-out questions (``eval_samples`` replies
   each, temperature 1, seeded): the judge's mean reward, the true accuracy (the reply equals
   the reference), how often the judge agrees with the truth, and its unparsed verdicts.

Example::

    tempering recipe rubric                                # defaults: docs/recipes/rubric.md
    tempering recipe rubric --judge-sft-steps 20 --sft-steps 20 --rl-steps 2 --out /tmp/rubric
"""

from __future__ import annotations

import random
from typing import ClassVar

from tempering.backend import ModelConfig
from tempering.envs.agent_data import HelperModel, write_chats
from tempering.envs.rubric_task import RubricTask, judge_examples, load_questions, rubric_figures
from tempering.recipes._agents import AgentRecipe, agent_sft
from tempering.recipes._common import RecipeResult, default_lora_rank, non_negative, positive, recipe_flags
from tempering.recipes.stages import Evaluate, RecipeSession, RLStage, SFTStage, sft_stage
from tempering_protocols import RLDatasetBuilder, SamplingClient, TrainOnWhat

__all__ = ["RubricRecipe"]


@recipe_flags(
    sft=agent_sft(300, 32, train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE),
    rl=RLStage(20, 1e-4, batch_size=8),
    group_size=8,
    max_tokens=12,
    eval_samples=4,
)
class RubricRecipe(AgentRecipe):
    """Rubric: train (or take) a judge, SFT the policy, RL against the judge; calling it runs
    it. Figures: docs/recipes/rubric.md."""

    NAME: ClassVar[str] = "rubric"
    judge_model: str | None = None
    """The judge's base model; default ``base_model``."""
    judge_examples: int = positive(2000)
    """Scripted verdicts the judge is trained on; as many, up to 200, are written about the
    held-out questions for the judge's held-out NLL."""
    judge_sft_steps: int = non_negative(150)
    """SFT steps of the judge (batches of ``sft.batch_size``, learning rate 2e-3); 0: use
    ``judge_model``'s base weights as the judge."""
    judge_renderer_name: str | None = None
    """The judge's renderer; default: its model's recommended one."""
    judge_timeout_s: float = 60.0
    """Time limit of one verdict; none in time gives no reward and masks the turn."""
    judge_max_tokens: int = positive(16)
    """Tokens per verdict (a hosted judge that reasons before its score needs a few hundred)."""
    eval_questions: int = positive(100)
    """Held-out questions evaluated (the single-turn ones of ``arithmetic_chat_test.jsonl``: 58)."""

    async def run(self, s: RecipeSession) -> RecipeResult:
        from tempering import assets

        judge_model = self.judge_model or self.base_model
        judge_path: str | None = None
        if self.judge_sft_steps > 0:
            rng = random.Random(f"rubric-judge/{self.seed}")
            train_q, test_q = (
                load_questions("arithmetic_chat.jsonl"),
                load_questions("arithmetic_chat_test.jsonl"),
            )
            data = s.run_dir / "data"
            judge_train = write_chats(
                data / "judge_train.jsonl", judge_examples(train_q, self.judge_examples, rng)
            )
            judge_test = write_chats(
                data / "judge_test.jsonl", judge_examples(test_q, min(200, self.judge_examples), rng)
            )
            s.say(f"judge SFT, {self.judge_sft_steps} steps -> {s.run_dir / 'judge'}")
            model = ModelConfig(
                base_model=judge_model, lora_rank=default_lora_rank(judge_model, self.lora_rank),
                seed=self.seed + 1, renderer_name=self.judge_renderer_name,
            )  # fmt: skip
            stage = SFTStage(self.judge_sft_steps, min(self.sft.batch_size, self.judge_examples), 2e-3)
            judge_sft = await sft_stage(
                s, "judge", stage, model=model, train_path=judge_train, test_path=judge_test, seed=self.seed
            )
            judge_path = judge_sft.final.sampler_path

        async def make_task(sft: object) -> tuple[RLDatasetBuilder, Evaluate[dict[str, float]]]:
            task = RubricTask(
                base_model=self.base_model, renderer_name=self.renderer_name, batch_size=self.rl.batch_size,
                group_size=self.group_size, eval_samples=self.eval_samples, seed=self.seed,
                judge_model=HelperModel(
                    path=judge_path, model=judge_model, renderer_name=self.judge_renderer_name
                ),
                judge_max_tokens=self.judge_max_tokens, judge_timeout_s=self.judge_timeout_s,
                n_batches=self.rl.steps, test=False, service=s.service,
            )  # fmt: skip
            held_out = load_questions("arithmetic_chat_test.jsonl")[: self.eval_questions]
            eval_builders = task.builders(held_out, await task.judge(), self.eval_samples)

            async def evaluate(stage: str, sampler: SamplingClient) -> dict[str, float]:
                return rubric_figures(stage, eval_builders, await self.play(sampler, eval_builders))

            return task, evaluate

        return await self.sft_then_rl(
            s,
            train_path=assets.path("arithmetic_chat.jsonl"),
            test_path=assets.path("arithmetic_chat_test.jsonl"),
            make_task=make_task,
            extra={"judge_checkpoint": judge_path},
        )
