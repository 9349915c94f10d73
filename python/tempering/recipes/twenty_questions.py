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
   ``rl_batch_size`` secrets × ``group_size`` games a step. Run directory ``<out>/rl``.
4. Evaluation of the SFT and RL askers against the same answerer: every secret,
   ``eval_samples`` games each, temperature 1, seeded: win rate, questions a game, and the
   answerer's unusable replies.

Example::

    tempering recipe twenty-questions                     # docs/recipes/twenty-questions.md
    tempering recipe twenty-questions --sft-steps 20 --rl-steps 2 --out /tmp/20q
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from tempering.backend import ServiceClient, service_client
from tempering.envs.completer import SamplingMessageCompleter
from tempering.envs.twenty_questions import (
    TwentyQuestionsDataset,
    TwentyQuestionsGroupBuilder,
    WordEntry,
    answerer_messages,
    asker_prompt,
    load_words,
    twenty_questions_stats,
)
from tempering.recipes._agents import AgentRecipe, Evaluate, FixedGroups, play, recipe_renderer, write_chats
from tempering.recipes._common import TINY_MODEL, RecipeResult, prepare_run_dir, recipe_service
from tempering_protocols import Message, MessageCompleter, RLDataset, RLDatasetBuilder, SamplingClient

if TYPE_CHECKING:
    from tempering.training import TrainResult

__all__ = [
    "TwentyQuestionsRecipe",
    "TwentyQuestionsTask",
    "category_question",
    "guess_question",
    "scripted_game",
]


def category_question(category: str) -> str:
    return f"Is it a kind of {category}?"


def guess_question(word: str) -> str:
    return f"Is the word {word}?"


def scripted_game(
    secret: WordEntry, words: Sequence[WordEntry], max_turns: int, rng: random.Random
) -> tuple[list[Message], list[list[Message]]]:
    """One scripted game: the asker's conversation, and the answerer's conversations (one per
    question that is not the winning guess)."""
    categories = list(dict.fromkeys(w.category for w in words))
    rng.shuffle(categories)
    asker: list[Message] = [{"role": "user", "content": asker_prompt(words, max_turns)}]
    answers: list[list[Message]] = []

    def ask(question: str, yes: bool) -> None:
        reply = "Yes." if yes else "No."
        asker.extend([{"role": "assistant", "content": question}, {"role": "user", "content": reply}])
        answers.append([*answerer_messages(secret, question), {"role": "assistant", "content": reply}])

    for category in categories:
        ask(category_question(category), category == secret.category)
        if category == secret.category:
            break
    guesses = [w.word for w in words if w.category == secret.category]
    rng.shuffle(guesses)
    for word in guesses:
        if word == secret.word:
            asker.append({"role": "assistant", "content": guess_question(word)})
            break
        ask(guess_question(word), False)
    return asker, answers


@attrs.frozen(kw_only=True)
class TwentyQuestionsTask:
    """The RL task: batches of secrets (every word), games against the answerer sampled from
    ``answerer_path`` (a checkpoint) or ``answerer_model`` (base weights); ``service`` serves it."""

    base_model: str = TINY_MODEL
    renderer_name: str | None = None
    answerer_path: str | None = None
    answerer_model: str | None = None
    answerer_renderer_name: str | None = None
    batch_size: int = 4
    group_size: int = 8
    eval_samples: int = 2
    n_batches: int = 20
    max_turns: int = 20
    turn_cost: float = 0.02
    seed: int = 0
    test: bool = True
    """Build the test set (the recipe evaluates by itself and passes ``False``)."""
    service: ServiceClient | None = attrs.field(default=None, eq=False, repr=False)

    async def answerer(self) -> MessageCompleter:
        service = self.service or service_client()
        model = self.answerer_model or self.base_model
        if self.answerer_path is not None:
            sampler = await service.create_sampling_client(model_path=self.answerer_path)
        else:
            sampler = await service.create_sampling_client(base_model=model)
        renderer = recipe_renderer(model, self.answerer_renderer_name or self.renderer_name)
        return SamplingMessageCompleter(sampler, renderer, max_tokens=6, temperature=1.0)

    def eval_builders(self, answerer: MessageCompleter) -> list[TwentyQuestionsGroupBuilder]:
        words = load_words()
        renderer = recipe_renderer(self.base_model, self.renderer_name)
        return [
            TwentyQuestionsGroupBuilder(
                w,
                words,
                renderer,
                answerer,
                group_size=self.eval_samples,
                max_turns=self.max_turns,
                turn_cost=self.turn_cost,
            )
            for w in words
        ]

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        words = load_words()
        answerer = await self.answerer()
        train = TwentyQuestionsDataset(
            words,
            words,
            recipe_renderer(self.base_model, self.renderer_name),
            answerer,
            batch_size=self.batch_size,
            group_size=self.group_size,
            n_batches=self.n_batches,
            seed=self.seed,
            max_turns=self.max_turns,
            turn_cost=self.turn_cost,
        )
        if not self.test:
            return train, None
        test = self.eval_builders(answerer)
        return train, FixedGroups(test, batch_size=len(test), n_batches=1, seed=self.seed)


@attrs.frozen(kw_only=True)
class TwentyQuestionsRecipe(AgentRecipe):
    """Twenty questions: SFT on scripted games (both roles), then RL of the asker against the
    frozen answerer; calling it runs it. Figures: docs/recipes/twenty-questions.md."""

    answerer_model: str | None = None
    """The answerer's base model (its base weights, untrained); default: the SFT checkpoint."""
    answerer_renderer_name: str | None = None
    max_turns: int = 20
    turn_cost: float = 0.02
    sft_games: int = 1000
    sft_steps: int = 120
    sft_learning_rate: float = 2e-3
    rl_steps: int = 8
    rl_batch_size: int = 2
    group_size: int = 8
    max_tokens: int = 40
    """Tokens per question; the tiny model's tokens are bytes, and a question past it (no stop
    token) ends the game: "Is it a kind of instrument?" is 27."""
    eval_samples: int = 1
    """Games per secret (36 secrets) in each evaluation."""

    def __attrs_post_init__(self) -> None:
        self.check_positive("max_turns", "sft_games", "eval_samples")

    async def __call__(self) -> RecipeResult:
        out = prepare_run_dir("twenty-questions", self.out)
        service = recipe_service(self.base_model)
        words = load_words()
        rng = random.Random(f"twenty-questions-sft/{self.seed}")
        rows: list[list[Message]] = []
        for _ in range(self.sft_games):
            asker, answers = scripted_game(rng.choice(words), words, self.max_turns, rng)
            rows += [asker, rng.choice(answers)] if answers else [asker]
        train_path = write_chats(out / "data" / "train.jsonl", rows)
        test_rng = random.Random(f"twenty-questions-test/{self.seed}")
        test_rows = [scripted_game(w, words, self.max_turns, test_rng)[0] for w in words]
        test_path = write_chats(out / "data" / "test.jsonl", test_rows)

        async def make_task(sft: TrainResult) -> tuple[RLDatasetBuilder, Evaluate]:
            task = TwentyQuestionsTask(
                base_model=self.base_model,
                renderer_name=self.renderer_name,
                answerer_path=None if self.answerer_model else sft.final.sampler_path,
                answerer_model=self.answerer_model,
                answerer_renderer_name=self.answerer_renderer_name,
                batch_size=self.rl_batch_size,
                group_size=self.group_size,
                eval_samples=self.eval_samples,
                n_batches=self.rl_steps,
                max_turns=self.max_turns,
                turn_cost=self.turn_cost,
                seed=self.seed,
                test=False,
                service=service,
            )
            eval_builders = task.eval_builders(await task.answerer())

            async def evaluate(stage: str, sampler: SamplingClient) -> dict[str, float]:
                played = await play(sampler, eval_builders, max_tokens=self.max_tokens, seed=self.seed + 7919)
                stats = twenty_questions_stats([t for ts in played for t in ts])
                return {f"{stage}_{k}": float(v) for k, v in attrs.asdict(stats).items() if k != "games"}

            return task, evaluate

        return await self.sft_then_rl(
            "twenty-questions",
            out,
            service,
            train_path=train_path,
            test_path=test_path,
            make_task=make_task,
            extra={"eval_games": len(words) * self.eval_samples},
        )
