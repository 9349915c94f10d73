"""Single-turn question → answer environments with a grader.

:class:`ProblemEnv` renders a question as a generation prompt, parses the sampled answer with
the renderer, and rewards ``format_coef * (parsed - 1) + correctness``: a clean parse costs
nothing, an unparseable answer costs ``format_coef``; correctness (in ``[0, 1]``) comes from the
grader. Metrics: ``format`` (1 when the answer parsed) and ``correct``.

A :class:`ProblemGroupBuilder` makes ``G`` envs of one problem (so the group's first turn is one
request with ``num_samples = G``); a :class:`ProblemDataset` yields ``P`` builders per batch,
depending only on ``(seed, index)``.

Every single-reply family (problems here, math, code) is the same three layers: an env
(:class:`SingleReplyEnv`), a group of one problem (:class:`SingleReplyGroup`, whose
:meth:`~SingleReplyGroup.make_env` builds the family's env) and a dataset
(:class:`SeededBatches`, whose :meth:`~SeededBatches.make_group` builds the family's group),
each constructed with its arguments named, so the type checker sees every one.

Example::

    renderer = get_renderer("chatml", tokenizer)
    builder = ProblemGroupBuilder(Problem("What is 2 + 2?", "4"), renderer, exact_match, group_size=8)
    dataset = ProblemDataset(problems, renderer, exact_match, batch_size=16, group_size=8)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypedDict, TypeVar

import attrs
import numpy as np
import tinker

from tempering_protocols import (
    Action,
    Env,
    EnvGroupBuilder,
    Message,
    Observation,
    Renderer,
    StepResult,
    StopCondition,
)

__all__ = [
    "Grader",
    "GroupSettings",
    "Problem",
    "ProblemDataset",
    "ProblemEnv",
    "ProblemGroupBuilder",
    "RepeatedEnvGroup",
    "SeededBatches",
    "SingleReplyEnv",
    "SingleReplyGroup",
    "batch_picks",
    "exact_match",
    "first_number_match",
    "held_out",
    "lowercase_fraction",
    "prompt_messages",
]

P = TypeVar("P")
D = TypeVar("D", bound=attrs.AttrsInstance)

Grader = Callable[[str, str], float]
"""``grader(response_text, reference_answer) -> correctness in [0, 1]``; must pickle (a
module-level function or a picklable object)."""


def exact_match(response: str, answer: str) -> float:
    """1.0 when the response, stripped, equals the answer, else 0.0."""
    return float(response.strip() == answer.strip())


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def first_number_match(response: str, answer: str) -> float:
    """1.0 when the first number in the response equals the answer (as text), else 0.0."""
    found = _NUMBER.search(response)
    return float(found is not None and found.group(0) == answer.strip())


def lowercase_fraction(response: str, answer: str) -> float:
    """The fraction of the response's characters that are ASCII lowercase letters (0 when empty).

    A dense reward a tiny model learns in a few steps (about 0.1 for random bytes).
    """
    del answer
    if not response:
        return 0.0
    return sum("a" <= c <= "z" for c in response) / len(response)


@attrs.frozen
class Problem:
    """A question and its reference answer."""

    question: str
    answer: str


def prompt_messages(
    question: str, instruction: str | None = None, system_prompt: str | None = None
) -> list[Message]:
    """The prompt conversation of one question: an optional system message, then the question
    with ``instruction`` (if any) after a blank line."""
    convo: list[Message] = []
    if system_prompt is not None:
        convo.append({"role": "system", "content": system_prompt})
    content = question if not instruction else f"{question}\n\n{instruction}"
    convo.append({"role": "user", "content": content})
    return convo


class SingleReplyEnv(Env):
    """The plumbing of a one-prompt, one-reply, graded env (single-use): a subclass holds
    ``renderer`` and ``_done`` (False at first) and says what the prompt is (:meth:`messages`)
    and how a parsed reply scores (:meth:`grade`)."""

    renderer: Renderer
    _done: bool

    def messages(self) -> list[Message]:
        """The prompt conversation."""
        raise NotImplementedError

    async def grade(self, content: str, parsed: bool) -> tuple[float, dict[str, float]]:
        """``(reward, metrics)`` of a reply's text (``parsed``: it ended with the stop sequence)."""
        raise NotImplementedError

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return self.renderer.build_generation_prompt(self.messages()), self.renderer.get_stop_sequences()

    async def step(self, action: Action, /) -> StepResult:
        if self._done:
            raise RuntimeError(f"{type(self).__name__} is single-use: the episode is over")
        self._done = True
        message, parsed = self.renderer.parse_response(action)
        reward, metrics = await self.grade(message["content"], parsed)
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self.renderer.get_stop_sequences(),
            metrics=metrics,
        )


class RepeatedEnvGroup(EnvGroupBuilder):
    """A group of ``group_size`` fresh envs from :meth:`make_env` (so they share the first
    observation), logged under ``tag``."""

    group_size: int
    tag: str

    def make_env(self) -> Env:
        """One fresh env of the group."""
        raise NotImplementedError

    async def make_envs(self) -> Sequence[Env]:
        return [self.make_env() for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return [self.tag]


@attrs.frozen
class SingleReplyGroup(RepeatedEnvGroup, Generic[P]):
    """``group_size`` envs of one problem (they share the first observation), each from
    :meth:`make_env`. A family adds its grading field (positional, after ``renderer``) and its
    prompt settings, and builds its env in :meth:`make_env`."""

    problem: P
    renderer: Renderer = attrs.field(eq=False)
    group_size: int = attrs.field(default=8, kw_only=True)
    system_prompt: str | None = attrs.field(default=None, kw_only=True)
    tag: str = attrs.field(default="problems", kw_only=True)

    def make_env(self) -> Env:
        """One fresh env of this problem."""
        raise NotImplementedError(f"{type(self).__name__}.make_env")


@attrs.define(eq=False)
class ProblemEnv(SingleReplyEnv):
    """One question, one answer, graded. Single-use.

    Example::

        env = ProblemEnv(Problem("What is 2 + 2?", "4"), renderer, exact_match)
        ob, stop = await env.initial_observation()
        result = await env.step(sampled_tokens)   # reward, episode_done=True
    """

    problem: Problem
    renderer: Renderer
    grader: Grader
    format_coef: float = attrs.field(default=0.1, kw_only=True)
    system_prompt: str | None = attrs.field(default=None, kw_only=True)
    _done: bool = attrs.field(init=False, default=False)

    def messages(self) -> list[Message]:
        """The prompt conversation."""
        return prompt_messages(self.problem.question, None, self.system_prompt)

    async def grade(self, content: str, parsed: bool) -> tuple[float, dict[str, float]]:
        correct = float(self.grader(content, self.problem.answer))
        reward = self.format_coef * (float(parsed) - 1.0) + correct
        return reward, {"format": float(parsed), "correct": correct}


@attrs.frozen
class ProblemGroupBuilder(SingleReplyGroup[Problem]):
    """``group_size`` :class:`ProblemEnv` of one problem (they share the first observation).

    Example::

        ProblemGroupBuilder(Problem("2+2?", "4"), renderer, exact_match, group_size=8, tag="arith")
    """

    grader: Grader
    format_coef: float = attrs.field(default=0.1, kw_only=True)

    def make_env(self) -> Env:
        return ProblemEnv(
            self.problem,
            self.renderer,
            self.grader,
            format_coef=self.format_coef,
            system_prompt=self.system_prompt,
        )


def batch_picks(n: int, batch_size: int, seed: int, index: int) -> list[int]:
    """The item indices of batch ``index`` over ``n`` items: each epoch (``n // batch_size``
    batches) a permutation seeded by ``(seed, epoch)``, read ``batch_size`` at a time."""
    per_epoch = max(1, n // batch_size)
    epoch, within = divmod(index, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return [int(order[(within * batch_size + i) % n]) for i in range(batch_size)]


def held_out(dataset: D, problems: Sequence[Any], *, group_size: int, seed: int) -> D:
    """A task's test set: ``dataset``'s settings over ``problems``, all of them in one batch,
    ``group_size`` replies each, seeded by ``seed``."""
    return attrs.evolve(
        dataset, problems=problems, batch_size=len(problems), group_size=group_size, n_batches=1, seed=seed
    )


class GroupSettings(TypedDict):
    """What a problem dataset (:class:`SeededBatches`) gives each of its groups
    (:class:`SingleReplyGroup`) besides the problem, the renderer and the grading
    (:meth:`SeededBatches.group_settings`)."""

    group_size: int
    system_prompt: str | None
    tag: str


@attrs.frozen
class SeededBatches(Generic[P]):
    """The plumbing of a problem dataset: ``batch_size`` of ``problems`` per batch in the order
    of :func:`batch_picks` (seeded by ``seed``, reshuffled each epoch), each a group of
    ``group_size`` replies from :meth:`make_group`; ``len`` is ``n_batches`` (default: one
    pass). A family adds its grading field (positional, after ``renderer``) and its prompt
    settings, and builds its group in :meth:`make_group` with :meth:`group_settings`."""

    problems: Sequence[P]
    renderer: Renderer = attrs.field(eq=False)
    batch_size: int = attrs.field(kw_only=True)
    group_size: int = attrs.field(kw_only=True)
    seed: int = attrs.field(default=0, kw_only=True)
    n_batches: int | None = attrs.field(default=None, kw_only=True)
    system_prompt: str | None = attrs.field(default=None, kw_only=True)
    tag: str = attrs.field(default="problems", kw_only=True)

    def make_group(self, problem: P, /) -> EnvGroupBuilder:
        """The group of envs of one problem."""
        raise NotImplementedError(f"{type(self).__name__}.make_group")

    def group_settings(self) -> GroupSettings:
        """This dataset's settings for each of its groups (``Group(problem, self.renderer,
        grading, **self.group_settings())``)."""
        return GroupSettings(group_size=self.group_size, system_prompt=self.system_prompt, tag=self.tag)

    def __len__(self) -> int:
        if self.n_batches is not None:
            return self.n_batches
        return max(1, len(self.problems) // self.batch_size)

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        picks = batch_picks(len(self.problems), self.batch_size, self.seed, index)
        return [self.make_group(self.problems[i]) for i in picks]


@attrs.frozen
class ProblemDataset(SeededBatches[Problem]):
    """``batch_size`` problems per batch, shuffled by ``seed`` (each epoch reshuffled), each a
    group of ``group_size`` envs. ``len`` is ``n_batches`` (default: one pass).

    Example::

        ds = ProblemDataset(problems, renderer, exact_match, batch_size=4, group_size=8)
        builders_P = ds.get_batch(0)
    """

    grader: Grader
    format_coef: float = attrs.field(default=0.1, kw_only=True)

    def make_group(self, problem: Problem, /) -> EnvGroupBuilder:
        return ProblemGroupBuilder(
            problem, self.renderer, self.grader, format_coef=self.format_coef, **self.group_settings()
        )
