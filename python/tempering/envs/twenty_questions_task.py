"""The twenty-questions task as an RL dataset, and scripted games (both roles) for SFT.

The policy asks yes/no questions to find a secret word from the shipped list
(:mod:`tempering.envs.twenty_questions`); another model, told the secret and its category,
answers. :func:`scripted_game` plays a scripted asker: "Is it a kind of <category>?" for the
categories in a random order until a yes, then that category's words in a random order; every
question it asks is also an answerer example (secret → "Yes." / "No.", always true).

Example::

    asker, answers = scripted_game(words[0], words, max_turns=20, rng=random.Random(0))
    task = TwentyQuestionsTask(answerer_model=HelperModel(path=sft_sampler_path), service=service)
    train, test = await task()
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from tempering.envs.agent_data import AgentTask, FixedGroups, HelperModel, helper_field
from tempering.envs.twenty_questions import (
    TwentyQuestionsDataset,
    TwentyQuestionsGroupBuilder,
    WordEntry,
    answerer_messages,
    asker_prompt,
    load_words,
)
from tempering_protocols import Message, MessageCompleter, RLDataset

__all__ = ["TwentyQuestionsTask", "category_question", "guess_question", "scripted_game"]


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
class TwentyQuestionsTask(AgentTask):
    """The RL task: batches of secrets (every word), games against the answerer sampled from
    ``answerer_model`` (a checkpoint, or base weights), served by ``service``; the test set:
    ``eval_samples`` games of every secret."""

    answerer_model: HelperModel = helper_field()
    max_turns: int = 20
    turn_cost: float = 0.02

    async def answerer(self) -> MessageCompleter:
        """The answerer: six tokens a reply, temperature 1."""
        return await self.helper_completer(self.answerer_model, max_tokens=6)

    def games(self, answerer: MessageCompleter) -> TwentyQuestionsDataset:
        """The training secrets' dataset: every word, games of ``max_turns`` and ``turn_cost``,
        batches and groups as this task's fields say."""
        words = load_words()
        return TwentyQuestionsDataset(
            words,
            words,
            self.renderer(),
            answerer,
            batch_size=self.batch_size,
            group_size=self.group_size,
            n_batches=self.n_batches,
            seed=self.seed,
            max_turns=self.max_turns,
            turn_cost=self.turn_cost,
        )

    def eval_builders(self, answerer: MessageCompleter) -> list[TwentyQuestionsGroupBuilder]:
        """A group of ``eval_samples`` games for every secret, with the training games' rules."""
        games = self.games(answerer)
        return [games.group(w, self.eval_samples) for w in games.secrets]

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        """The training secrets' dataset (:meth:`games`) and the test set (:meth:`eval_builders`)."""
        answerer = await self.answerer()
        train = self.games(answerer)
        return train, FixedGroups.one_batch(self.eval_builders(answerer), self.seed) if self.test else None
