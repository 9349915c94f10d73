"""``tempering recipe twenty-questions``: multi-agent RL against an LLM answerer.

The policy asks yes/no questions to find a secret word from the shipped list (36 words in six
categories, ``tempering-assets:agents/twenty_questions_words.jsonl``); another model, told the
secret and its category, answers (:mod:`tempering.envs.twenty_questions`). Winning at question
``t`` scores ``1 - turn_cost * (t - 1)``; ``max_turns`` questions without a win score 0.

1. Data: scripted games, both roles. The scripted asker asks "Is it a kind of <category>?" for
   categories in a random order until a yes, then guesses that category's words in a random
   order (about 7 questions a game); every question it asks is also an answerer example
   (secret → "Yes." / "No.", always true). Chat JSONL in ``<out>/data``.
2. SFT (every assistant turn) of one model on both roles; run directory ``<out>/sft``.
3. RL of the asker from the SFT checkpoint; the answerer is the SFT checkpoint, frozen
   (``--answerer-model``: another model's base weights instead, e.g. a large hosted model).
   ``rl.batch_size`` secrets × ``group_size`` games a step. Run directory ``<out>/rl``.
4. Evaluation of the SFT and RL askers against the same answerer: every secret,
   ``eval_samples`` games each, temperature 1, seeded: win rate, questions a game, and the
   answerer's unusable replies.

Example::

    tempering recipe twenty-questions                     # docs/recipes/twenty-questions.md
    tempering recipe twenty-questions --sft-steps 20 --rl-steps 2 --out /tmp/20q
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, ClassVar

import attrs

from tempering.envs.agent_data import HelperModel, write_chats
from tempering.envs.twenty_questions import load_words, twenty_questions_stats
from tempering.envs.twenty_questions_task import TwentyQuestionsTask, scripted_game
from tempering.recipes._agents import AgentRecipe, agent_sft
from tempering.recipes._common import RecipeResult, positive, recipe_flags
from tempering.recipes.stages import Evaluate, RecipeSession, RLStage
from tempering_protocols import Message, RLDatasetBuilder, SamplingClient

if TYPE_CHECKING:
    from tempering.training import TrainResult

__all__ = ["TwentyQuestionsRecipe"]


@recipe_flags(sft=agent_sft(120), rl=RLStage(8, 1e-4, batch_size=2), group_size=8, max_tokens=40)
class TwentyQuestionsRecipe(AgentRecipe):
    """Twenty questions: SFT on scripted games (both roles), then RL of the asker against the
    frozen answerer; calling it runs it. ``max_tokens``: per question (the tiny model's tokens are
    bytes, and a question past it, with no stop token, ends the game: "Is it a kind of
    instrument?" is 27); ``eval_samples``: games per secret (36 secrets) in each evaluation.
    Figures: docs/recipes/twenty-questions.md."""

    NAME: ClassVar[str] = "twenty-questions"
    answerer_model: str | None = None
    """The answerer's base model (its base weights, untrained); default: the SFT checkpoint."""
    answerer_renderer_name: str | None = None
    """The answerer's renderer; default: its model's recommended one."""
    max_turns: int = positive(20)
    """Questions per game; a game not won by then scores 0."""
    turn_cost: float = 0.02
    """A win at question ``t`` scores ``1 - turn_cost * (t - 1)``."""
    sft_games: int = positive(1000)
    """Scripted games written for the SFT stage."""

    async def run(self, s: RecipeSession) -> RecipeResult:
        words = load_words()
        rng = random.Random(f"twenty-questions-sft/{self.seed}")
        rows: list[list[Message]] = []
        for _ in range(self.sft_games):
            asker, answers = scripted_game(rng.choice(words), words, self.max_turns, rng)
            rows += [asker, rng.choice(answers)] if answers else [asker]
        train_path = write_chats(s.run_dir / "data" / "train.jsonl", rows)
        test_rng = random.Random(f"twenty-questions-test/{self.seed}")
        test_rows = [scripted_game(w, words, self.max_turns, test_rng)[0] for w in words]
        test_path = write_chats(s.run_dir / "data" / "test.jsonl", test_rows)

        async def make_task(sft: TrainResult | None) -> tuple[RLDatasetBuilder, Evaluate[dict[str, float]]]:
            assert sft is not None
            answerer_path = None if self.answerer_model else sft.final.sampler_path
            task = TwentyQuestionsTask(
                base_model=self.base_model, renderer_name=self.renderer_name, batch_size=self.rl.batch_size,
                group_size=self.group_size, eval_samples=self.eval_samples, seed=self.seed,
                answerer_model=HelperModel(
                    path=answerer_path, model=self.answerer_model, renderer_name=self.answerer_renderer_name
                ),
                max_turns=self.max_turns, turn_cost=self.turn_cost,
                n_batches=self.rl.steps, test=False, service=s.service,
            )  # fmt: skip
            eval_builders = task.eval_builders(await task.answerer())

            async def evaluate(stage: str, sampler: SamplingClient) -> dict[str, float]:
                played = await self.play(sampler, eval_builders)
                stats = twenty_questions_stats([t for ts in played for t in ts])
                return {f"{stage}_{k}": float(v) for k, v in attrs.asdict(stats).items() if k != "games"}

            return task, evaluate

        extra = {"eval_games": len(words) * self.eval_samples}
        return await self.sft_then_rl(
            s, train_path=train_path, test_path=test_path, make_task=make_task, extra=extra
        )
