"""Twenty questions against an LLM: the policy asks, another model answers yes or no.

The answerer is a :class:`~tempering_protocols.MessageCompleter` (an
:class:`~tempering.envs.completer.SamplingMessageCompleter` over any sampling client) that is
told the secret word and its category; the asker (the policy being trained) sees the list of
possible words and categories, and asks one question a turn. A question that names exactly one
listed word, and it is the secret, wins: reward ``1 - turn_cost * (turns - 1)``. Otherwise the
answerer's reply, normalised to ``Yes.`` / ``No.``, is the next user message; ``max_turns``
questions without a win score 0. The env, not the answerer, decides the win, so a confused
answerer cannot award one.

The answerer's failures are the answerer's: a reply that is not yes or no, one that takes longer
than ``answer_timeout_s``, or one that raises is shown to the asker as ``(no answer)`` and
counted; the game goes on.

Metrics of the last step: ``twenty_q/won``, ``twenty_q/turns``; of every step:
``twenty_q/answer_invalid``, ``twenty_q/answer_timeout``, ``twenty_q/answer_error``,
``twenty_q/multi_guess`` (a question naming several listed words).

:class:`TwentyQuestionsGroupBuilder`: ``group_size`` games of one secret (the group's rewards
are compared, as in guess-number); :class:`TwentyQuestionsDataset`: batches of secrets.

Example::

    answerer = SamplingMessageCompleter(answer_sampler, renderer, max_tokens=4)
    builder = TwentyQuestionsGroupBuilder(WordEntry("cat", "animal"), words, renderer, answerer)
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from tempering.envs.message import MessageEnvAdapter, MessageStepResult
from tempering.envs.problem import RepeatedEnvGroup
from tempering_protocols import Env, EnvGroupBuilder, Message, MessageCompleter, Metrics, Renderer, Trajectory

__all__ = [
    "TwentyQuestionsDataset",
    "TwentyQuestionsEnv",
    "TwentyQuestionsGroupBuilder",
    "TwentyQuestionsStats",
    "WordEntry",
    "answerer_messages",
    "asker_prompt",
    "load_words",
    "normalise_answer",
    "twenty_questions_stats",
]


@attrs.frozen
class WordEntry:
    """A secret word and its category."""

    word: str
    category: str


def load_words(path: str | Path | None = None) -> list[WordEntry]:
    """The words of a JSONL file of ``{"word", "category"}`` rows (default: the shipped list,
    ``tempering-assets:agents/twenty_questions_words.jsonl``)."""
    if path is None:
        from tempering import assets

        path = assets.path("agents/twenty_questions_words.jsonl")
    out: list[WordEntry] = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("word", "category")):
            raise ValueError(f"{path}:{number}: each row must be {{'word': str, 'category': str}}")
        out.append(WordEntry(str(row["word"]).lower(), str(row["category"]).lower()))  # pyright: ignore[reportUnknownArgumentType]
    if len({w.word for w in out}) != len(out):
        raise ValueError(f"{path}: the words must be distinct")
    return out


def asker_prompt(words: Sequence[WordEntry], max_turns: int) -> str:
    """The asker's first message: the rules, the categories and the words."""
    categories: dict[str, list[str]] = {}
    for w in words:
        categories.setdefault(w.category, []).append(w.word)
    listing = "\n".join(f"{c}: {', '.join(ws)}" for c, ws in categories.items())
    return (
        f"Twenty questions: find my secret word in at most {max_turns} yes/no questions. "
        f"Name one word to guess it.\n{listing}"
    )


def answerer_messages(secret: WordEntry, question: str) -> list[Message]:
    """What the answerer sees: the secret, its category, and the question."""
    return [
        {
            "role": "system",
            "content": f"Secret word: {secret.word} (category: {secret.category}). Answer yes or no.",
        },
        {"role": "user", "content": question},
    ]


def normalise_answer(text: str) -> str | None:
    """``"Yes."`` or ``"No."`` when the reply starts with yes or no (any case, punctuation), else ``None``."""
    first = re.match(r"\s*([A-Za-z]+)", text)
    word = first.group(1).lower() if first else ""
    return {"yes": "Yes.", "no": "No."}.get(word)


@attrs.define(eq=False)
class TwentyQuestionsEnv:
    """One game: the asker (this env's policy) against ``answerer``; single-use."""

    secret: WordEntry
    words: list[WordEntry] = attrs.field(converter=list)
    answerer: MessageCompleter
    max_turns: int = attrs.field(default=20, kw_only=True)
    turn_cost: float = attrs.field(default=0.02, kw_only=True)
    answer_timeout_s: float = attrs.field(default=60.0, kw_only=True)
    history: list[Message] = attrs.field(init=False)
    turns: int = attrs.field(default=0, init=False)
    won: bool = attrs.field(default=False, init=False)
    done: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        if self.secret not in self.words:
            raise ValueError(f"TwentyQuestionsEnv: the secret {self.secret.word!r} is not among the words")
        self.history = [{"role": "user", "content": asker_prompt(self.words, self.max_turns)}]

    async def initial_messages(self) -> Sequence[Message]:
        return list(self.history)

    def named_words(self, question: str) -> list[str]:
        """The listed words a question names (whole words, any case)."""
        tokens = set(re.findall(r"[a-z]+", question.lower()))
        return [w.word for w in self.words if w.word in tokens]

    async def _answer(self, question: str, metrics: Metrics) -> str:
        try:
            async with asyncio.timeout(self.answer_timeout_s):
                reply = await self.answerer(answerer_messages(self.secret, question))
        except TimeoutError:
            metrics["twenty_q/answer_timeout"] = 1
            return "(no answer)"
        except Exception:
            metrics["twenty_q/answer_error"] = 1
            return "(no answer)"
        answer = normalise_answer(reply["content"])
        if answer is None:
            metrics["twenty_q/answer_invalid"] = 1
            return "(no answer)"
        return answer

    def _end(self, metrics: Metrics) -> MessageStepResult:
        self.done = True
        reward = 1.0 - self.turn_cost * (self.turns - 1) if self.won else 0.0
        metrics |= {"twenty_q/won": int(self.won), "twenty_q/turns": self.turns}
        return MessageStepResult(reward=reward, episode_done=True, metrics=metrics)

    async def step(self, message: Message, /) -> MessageStepResult:
        if self.done:
            raise RuntimeError("TwentyQuestionsEnv is single-use and this game is over")
        self.turns += 1
        question = message["content"].strip()
        metrics: Metrics = {
            "twenty_q/answer_invalid": 0,
            "twenty_q/answer_timeout": 0,
            "twenty_q/answer_error": 0,
            "twenty_q/multi_guess": 0,
        }
        named = self.named_words(question)
        if named == [self.secret.word]:
            self.won = True
            return self._end(metrics)
        metrics["twenty_q/multi_guess"] = int(len(named) > 1)
        if self.turns >= self.max_turns:
            return self._end(metrics)
        answer = await self._answer(question, metrics)
        self.history.append(Message(role="assistant", content=question))
        self.history.append(Message(role="user", content=answer))
        return MessageStepResult(
            reward=0.0, episode_done=False, next_messages=list(self.history), metrics=metrics
        )


@attrs.frozen
class TwentyQuestionsGroupBuilder(RepeatedEnvGroup):
    """``group_size`` games with the same ``secret`` against ``answerer``."""

    secret: WordEntry
    words: Sequence[WordEntry] = attrs.field(eq=False)
    renderer: Renderer = attrs.field(eq=False)
    answerer: MessageCompleter = attrs.field(eq=False)
    group_size: int = 8
    max_turns: int = 20
    turn_cost: float = 0.02
    answer_timeout_s: float = 60.0
    max_context_tokens: int | None = None
    tag: str = "twenty_questions"

    def make_env(self) -> Env:
        game = TwentyQuestionsEnv(
            self.secret,
            self.words,
            self.answerer,
            max_turns=self.max_turns,
            turn_cost=self.turn_cost,
            answer_timeout_s=self.answer_timeout_s,
        )
        return MessageEnvAdapter(
            game,
            self.renderer,
            max_context_tokens=self.max_context_tokens,
            on_parse_error="penalty",
            penalty=0.0,
        )


@attrs.frozen
class TwentyQuestionsDataset:
    """``n_batches`` batches of ``batch_size`` secrets drawn from ``secrets`` (seeded by
    ``(seed, index)``), each a :class:`TwentyQuestionsGroupBuilder` of ``group_size`` games with
    this dataset's ``max_turns`` and ``turn_cost``."""

    secrets: Sequence[WordEntry]
    words: Sequence[WordEntry] = attrs.field(eq=False)
    renderer: Renderer = attrs.field(eq=False)
    answerer: MessageCompleter = attrs.field(eq=False)
    batch_size: int = attrs.field(kw_only=True)
    group_size: int = attrs.field(kw_only=True)
    n_batches: int = attrs.field(kw_only=True)
    seed: int = attrs.field(default=0, kw_only=True)
    max_turns: int = attrs.field(default=20, kw_only=True)
    turn_cost: float = attrs.field(default=0.02, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if not self.secrets:
            raise ValueError("TwentyQuestionsDataset: no secrets")

    def __len__(self) -> int:
        return self.n_batches

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        rng = np.random.default_rng([self.seed, index])
        picks = rng.choice(
            len(self.secrets), size=self.batch_size, replace=self.batch_size > len(self.secrets)
        )
        return [self.group(self.secrets[int(i)], self.group_size) for i in picks]

    def group(self, secret: WordEntry, group_size: int) -> TwentyQuestionsGroupBuilder:
        """``group_size`` games of ``secret`` with this dataset's words, answerer and rules
        (``max_turns``, ``turn_cost``): a training group, or a test group of any size."""
        return TwentyQuestionsGroupBuilder(
            secret,
            self.words,
            self.renderer,
            self.answerer,
            group_size=group_size,
            max_turns=self.max_turns,
            turn_cost=self.turn_cost,
        )


@attrs.frozen
class TwentyQuestionsStats:
    """Over finished games: ``won`` (rate), ``turns`` (mean questions), ``answer_invalid``
    (the answerer's unusable replies per question)."""

    games: int
    won: float
    turns: float
    answer_invalid: float


def twenty_questions_stats(trajectories: Sequence[Trajectory]) -> TwentyQuestionsStats:
    """:class:`TwentyQuestionsStats` from the trajectories' step metrics."""
    won = turns = invalid = questions = 0.0
    games = 0
    for traj in trajectories:
        if not traj.transitions:
            continue
        games += 1
        last = traj.transitions[-1].metrics
        won += float(last.get("twenty_q/won", 0))
        turns += float(last.get("twenty_q/turns", len(traj.transitions)))
        for t in traj.transitions:
            invalid += float(t.metrics.get("twenty_q/answer_invalid", 0))
            questions += 1
    if not games:
        nan = float("nan")
        return TwentyQuestionsStats(0, nan, nan, nan)
    return TwentyQuestionsStats(games, won / games, turns / games, invalid / max(1.0, questions))
