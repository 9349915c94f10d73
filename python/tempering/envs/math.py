"""Math word problems with a real grader: correctness by :class:`~tempering.grading.MathGrader`
(answer equivalence, time-limited) plus a format reward for a ``\\boxed{}`` answer.

:class:`MathEnv` asks one question (followed by ``instruction``), parses the sampled reply with
the renderer and rewards it with

    ``reward = correct_weight * correct + format_weight * (formatted - 1)``

where ``correct`` is 1 when the grader finds the reply's final answer equivalent to the
reference, and ``formatted`` is 1 when the reply parsed (it ended with the stop sequence) and
holds a ``\\boxed{...}`` answer: a well-formatted wrong answer costs nothing, an unformatted one
costs ``format_weight``. A grader timeout or error gives ``correct = 0`` and is counted in the
step's metrics (``grader/timeouts``, ``grader/errors``); it never fails the rollout.

:class:`MathGroupBuilder` makes ``G`` envs of one problem; :class:`MathDataset` yields ``P``
builders per batch depending only on ``(seed, index)``; :class:`MathTask` is the
``RLDatasetBuilder``: a dataset by name (``gsm8k``, ``math``, ``math500``, ``deepmath``,
``polaris``, ``aime``; :mod:`tempering.data.hub`) from the hub or a local copy.

Example::

    train, test = await MathTask(dataset="gsm8k", source="tempering-assets:word_problems.jsonl",
                                 test_source="tempering-assets:word_problems_test.jsonl")()
    train, test = await MathTask(dataset="math", test_dataset="math500",
                                 base_model="Qwen/Qwen3.5-9B")()        # from the hub
"""

from __future__ import annotations

from typing import Any

import attrs

from tempering.data.hub import MATH_DATASETS, MathProblem, load_math_problems
from tempering.envs.problem import SeededBatches, SingleReplyEnv, SingleReplyGroup, prompt_messages
from tempering.envs.task_base import HeldOutTask
from tempering.grading import ExtractStyle, MathGrader, extract_answer
from tempering_protocols import Env, EnvGroupBuilder, Message, Renderer, RLDataset

__all__ = [
    "DEFAULT_INSTRUCTION",
    "MathDataset",
    "MathEnv",
    "MathGroupBuilder",
    "MathRewards",
    "MathTask",
    "prompt_messages",
]

DEFAULT_INSTRUCTION = "Put the final answer in \\boxed{}."
"""Appended to every question (after a blank line) unless the task says otherwise."""


@attrs.frozen
class MathRewards:
    """The reward's weights and the grader (shared by every env of a task)."""

    grader: MathGrader = attrs.field(factory=MathGrader)
    correct_weight: float = 1.0
    format_weight: float = 0.1

    async def score(self, text: str, parsed: bool, reference: str) -> tuple[float, dict[str, float]]:
        """``(reward, metrics)`` of one reply; never raises for what the model wrote."""
        formatted = float(parsed and extract_answer(text, "boxed") is not None)
        try:
            result = await self.grader.agrade(text, reference)
        except Exception:  # a grader failure is a reward of 0, never a crashed rollout
            metrics = {"grader/correct": 0.0, "grader/no_answer": 0.0, "grader/timeouts": 0.0}
            metrics["grader/errors"] = 1.0
        else:
            metrics = result.metrics()
        correct = metrics["grader/correct"]
        reward = self.correct_weight * correct + self.format_weight * (formatted - 1.0)
        return reward, {**metrics, "correct": correct, "format": formatted}


@attrs.define(eq=False)
class MathEnv(SingleReplyEnv):
    """One math question, one graded reply. Single-use.

    Example::

        env = MathEnv(MathProblem("What is 2 + 2?", "4", "here"), renderer, MathRewards())
        ob, stop = await env.initial_observation()
        result = await env.step(sampled_tokens)   # result.metrics["correct"], ["format"]
    """

    problem: MathProblem
    renderer: Renderer
    rewards: MathRewards
    instruction: str | None = attrs.field(default=DEFAULT_INSTRUCTION, kw_only=True)
    system_prompt: str | None = attrs.field(default=None, kw_only=True)
    _done: bool = attrs.field(init=False, default=False)

    def messages(self) -> list[Message]:
        return prompt_messages(self.problem.question, self.instruction, self.system_prompt)

    async def grade(self, content: str, parsed: bool) -> tuple[float, dict[str, float]]:
        return await self.rewards.score(content, parsed, self.problem.answer)


@attrs.frozen
class MathGroupBuilder(SingleReplyGroup[MathProblem]):
    """``group_size`` :class:`MathEnv` of one problem (they share the first observation)."""

    rewards: MathRewards
    instruction: str | None = attrs.field(default=DEFAULT_INSTRUCTION, kw_only=True)
    tag: str = attrs.field(default="math", kw_only=True)

    def make_env(self) -> Env:
        return MathEnv(
            self.problem,
            self.renderer,
            self.rewards,
            instruction=self.instruction,
            system_prompt=self.system_prompt,
        )


@attrs.frozen
class MathDataset(SeededBatches[MathProblem]):
    """``batch_size`` problems per batch, shuffled by ``seed`` (reshuffled each epoch), each a
    :class:`MathGroupBuilder` of ``group_size`` envs; ``len`` is ``n_batches`` (default: one pass)."""

    rewards: MathRewards
    instruction: str | None = attrs.field(default=DEFAULT_INSTRUCTION, kw_only=True)
    tag: str = attrs.field(default="math", kw_only=True)

    def make_group(self, problem: MathProblem, /) -> EnvGroupBuilder:
        return MathGroupBuilder(
            problem, self.renderer, self.rewards, instruction=self.instruction, **self.group_settings()
        )


def _check_dataset(instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    del instance
    if value is not None and value not in MATH_DATASETS:
        raise ValueError(
            f"MathTask.{attribute.name}: unknown dataset {value!r}; known: {', '.join(MATH_DATASETS)}"
        )


@attrs.frozen(kw_only=True)
class MathTask(HeldOutTask):
    """The math RL task (an ``RLDatasetBuilder``): ``dataset``'s ``split`` (from ``source``: the
    hub by default, or a local directory or file in its schema) for training, and
    ``test_dataset``'s ``test_split`` (default: ``dataset``; its test split, if it has one) for
    the held-out set. Picklable.

    Example::

        MathTask(dataset="gsm8k", limit=1000, batch_size=64, group_size=16)          # hub
        MathTask(dataset="deepmath", test_dataset="math500", base_model="Qwen/Qwen3.5-9B")
    """

    dataset: str = attrs.field(default="gsm8k", validator=_check_dataset)
    """A name in ``tempering.data.hub.MATH_DATASETS``: gsm8k, math, math500, deepmath, polaris, aime."""
    source: str | None = None
    """Hub name or local path of the training data (default: the dataset's hub name)."""
    split: str = "train"
    limit: int | None = None
    """Read at most this many training problems."""
    test_dataset: str | None = attrs.field(default=None, validator=_check_dataset)
    test_source: str | None = None
    test_split: str | None = None
    """Default: the test dataset's ``test`` split; none (no test set) when it has no other split
    than the training one."""
    test_limit: int | None = 200
    """Read at most this many held-out problems."""
    correct_weight: float = 1.0
    """Reward of a correct answer."""
    format_weight: float = 0.1
    """Cost of a reply without a \\boxed{} answer (or that did not end with the stop sequence)."""
    instruction: str | None = DEFAULT_INSTRUCTION
    """Added after each question, past a blank line (None: the question alone)."""
    system_prompt: str | None = None
    """A system message before each question."""
    answer_style: ExtractStyle = "auto"
    """Where the grader reads the reply's answer (``auto``: ``\\boxed``, ``####``, "the answer
    is", else the last number)."""
    grader_timeout_s: float = 5.0
    """Time limit of one answer check (a timeout is a wrong answer)."""

    def rewards(self) -> MathRewards:
        """The task's reward weights and grader."""
        grader = MathGrader(style=self.answer_style, timeout_s=self.grader_timeout_s)
        return MathRewards(grader, correct_weight=self.correct_weight, format_weight=self.format_weight)

    def test_problems(self) -> list[MathProblem] | None:
        """The held-out problems, or None when there is no held-out split."""
        name = self.test_dataset or self.dataset
        split: str | None = self.test_split
        if split is None:
            spec = MATH_DATASETS[name]
            if spec.default_split == self.split and name == self.dataset and self.test_source is None:
                return None
            split = spec.default_split
        return load_math_problems(name, source=self.test_source, split=split, limit=self.test_limit)

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        train = load_math_problems(self.dataset, source=self.source, split=self.split, limit=self.limit)
        train_ds = MathDataset(
            train,
            self.renderer(),
            self.rewards(),
            **self.batching(),
            system_prompt=self.system_prompt,
            instruction=self.instruction,
            tag=self.dataset,
        )
        return self.with_test(train_ds, self.test_problems())
