"""Code RL: write a Python program, graded by running the problem's tests in a sandbox.

A :class:`CodeProblem` is a prompt and test statements (``"assert add(1, 2) == 3"``). The
:class:`CodeEnv` asks the prompt, takes the program from the reply's last ```` ```python ````
block (:func:`~tempering.tools.sandbox.extract_program`), runs the tests against it in a
``tempering_protocols.Sandbox`` (:func:`~tempering.tools.sandbox.grade_program`) and rewards

    ``format_coef * (has_block - 1) + correctness``

where correctness is the pass fraction (``reward="fraction"``) or 1 only when every test passes
(``reward="all"``). Code that crashes, loops, forks, allocates or prints without end gets a
failed grade with the sandbox's reason, never an exception: the rollout and the run go on.
Metrics: ``format``, ``pass_fraction``, ``all_pass``, ``sandbox_limit`` (a limit stopped it),
``sandbox_error`` (the sandbox itself failed).

:class:`CodeTask` (an ``RLDatasetBuilder``) serves the shipped problems
(``tempering-assets:code/problems.jsonl``, 40 one-function problems, 3 tests each) split into
train and test by a seed.

Example::

    grading = CodeGrading(LocalSandbox(wall_seconds=5), reward="fraction")
    builder = CodeGroupBuilder(problem, renderer, grading, group_size=8)
    train, test = await CodeTask(batch_size=4, group_size=8)()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, cast

import attrs
import numpy as np

from tempering.assets import resolve_data_path
from tempering.data import RowError, parse_rows
from tempering.envs.problem import SeededBatches, SingleReplyEnv, SingleReplyGroup, prompt_messages
from tempering.envs.task_base import HeldOutTask
from tempering.tools.sandbox import LocalSandbox, extract_program, grade_program
from tempering_protocols import Env, EnvGroupBuilder, Message, Renderer, RLDataset, Sandbox

__all__ = [
    "CODE_PROBLEMS",
    "CODE_SYSTEM_PROMPT",
    "CodeDataset",
    "CodeEnv",
    "CodeGrading",
    "CodeGroupBuilder",
    "CodeProblem",
    "CodeTask",
    "RewardMode",
    "code_messages",
    "load_code_problems",
    "split_code_problems",
]

CODE_PROBLEMS = "tempering-assets:code/problems.jsonl"
"""The shipped problems: 40 small one-function tasks with 3 asserts each and a reference solution."""

CODE_SYSTEM_PROMPT = "Answer with Python code in a ```python block."

RewardMode = Literal["fraction", "all"]


@attrs.frozen
class CodeProblem:
    """A programming problem: its prompt, its tests (Python statements), a reference solution."""

    id: str
    prompt: str
    tests: tuple[str, ...]
    solution: str | None = None


def _field(row: Mapping[str, object], key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"{key!r} must be a non-empty string, got {value!r}")
    return value


def _code_problem(row: object) -> CodeProblem:
    """The problem in a ``{"id", "prompt", "tests": [...], "solution"?}`` row."""
    if not isinstance(row, Mapping):
        raise RowError("a row must be a JSON object")
    fields = cast("Mapping[str, object]", row)
    tests = fields.get("tests")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):  # pyright: ignore[reportUnknownVariableType]
        raise RowError("'tests' must be a non-empty list of Python statements (strings)")
    solution = fields.get("solution")
    return CodeProblem(
        _field(fields, "id"),
        _field(fields, "prompt"),
        tuple(str(t) for t in tests),  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
        solution if isinstance(solution, str) else None,
    )


def load_code_problems(path: str = CODE_PROBLEMS) -> list[CodeProblem]:
    """Read problems from JSONL rows ``{"id", "prompt", "tests": [...], "solution"?}``.

    ``path`` may be ``tempering-assets:NAME``. A bad row is a ``ValueError`` naming the file and
    line and what is wrong with it.
    """
    file = Path(resolve_data_path(path))
    if not file.is_file():
        raise FileNotFoundError(f"code problems: no file at {file} (from {path!r})")
    problems: list[CodeProblem] = []
    seen: set[str] = set()
    for where, problem in parse_rows(file, _code_problem, format="jsonl"):
        if problem.id in seen:
            raise ValueError(f"{where}: duplicate problem id {problem.id!r}")
        seen.add(problem.id)
        problems.append(problem)
    if not problems:
        raise ValueError(f"code problems: {file} holds no problems")
    return problems


def split_code_problems(
    problems: Sequence[CodeProblem], *, n_test: int, seed: int
) -> tuple[list[CodeProblem], list[CodeProblem]]:
    """``(train, test)``: ``n_test`` problems held out by a shuffle seeded with ``seed`` (0: none
    held out, and the test list is the training list)."""
    if not 0 <= n_test < len(problems):
        raise ValueError(
            f"n_test must be in 0..{len(problems) - 1} for {len(problems)} problems, got {n_test}"
        )
    order = [int(i) for i in np.random.default_rng([seed, 0xC0DE]).permutation(len(problems))]
    train = [problems[i] for i in order[n_test:]]
    test = [problems[i] for i in order[:n_test]] or train
    return train, test


def code_messages(problem: CodeProblem, system_prompt: str | None = CODE_SYSTEM_PROMPT) -> list[Message]:
    """The prompt conversation of ``problem`` (no system message when ``system_prompt`` is empty)."""
    return prompt_messages(problem.prompt, None, system_prompt or None)


@attrs.frozen(kw_only=True)
class CodeGrading:
    """How a reply is graded: the sandbox, the reward mode, the format penalty, the run timeout."""

    sandbox: Sandbox = attrs.field(factory=lambda: LocalSandbox(wall_seconds=5.0, cpu_seconds=5))
    reward: RewardMode = "fraction"
    format_coef: float = 0.1
    timeout: float | None = None
    """Seconds for one grading run (default: the sandbox's own wall-time limit)."""

    def __attrs_post_init__(self) -> None:
        if self.reward not in ("fraction", "all"):
            raise ValueError(f"CodeGrading.reward must be 'fraction' or 'all', got {self.reward!r}")


@attrs.define(eq=False)
class CodeEnv(SingleReplyEnv):
    """One problem, one reply, graded by its tests in the sandbox. Single-use."""

    problem: CodeProblem
    renderer: Renderer
    grading: CodeGrading
    system_prompt: str | None = attrs.field(default=CODE_SYSTEM_PROMPT, kw_only=True)
    _done: bool = attrs.field(init=False, default=False)

    def messages(self) -> list[Message]:
        return code_messages(self.problem, self.system_prompt)

    async def grade(self, content: str, parsed: bool) -> tuple[float, dict[str, float]]:
        del parsed  # the format is the ```python block, parsed or not
        program = extract_program(content)
        metrics = {
            "format": 0.0,
            "pass_fraction": 0.0,
            "all_pass": 0.0,
            "sandbox_limit": 0.0,
            "sandbox_error": 0.0,
        }
        if program is not None:
            grade = await grade_program(
                self.grading.sandbox, program, self.problem.tests, timeout=self.grading.timeout
            )
            metrics["format"] = 1.0
            metrics["pass_fraction"] = grade.fraction
            metrics["all_pass"] = float(grade.all_passed)
            metrics["sandbox_error"] = float(grade.status == "sandbox_error")
            metrics["sandbox_limit"] = float(grade.status not in ("ok", "error", "sandbox_error"))
        correct = metrics["all_pass"] if self.grading.reward == "all" else metrics["pass_fraction"]
        return self.grading.format_coef * (metrics["format"] - 1.0) + correct, metrics


@attrs.frozen
class CodeGroupBuilder(SingleReplyGroup[CodeProblem]):
    """``group_size`` :class:`CodeEnv` of one problem (one sampling request with ``num_samples = G``)."""

    grading: CodeGrading
    system_prompt: str | None = attrs.field(default=CODE_SYSTEM_PROMPT, kw_only=True)
    tag: str = attrs.field(default="code", kw_only=True)

    def make_env(self) -> Env:
        return CodeEnv(self.problem, self.renderer, self.grading, system_prompt=self.system_prompt)


@attrs.frozen
class CodeDataset(SeededBatches[CodeProblem]):
    """``batch_size`` problems per batch in a seeded order reshuffled each epoch, each a
    :class:`CodeGroupBuilder` of ``group_size`` replies; ``len`` is ``n_batches`` (default: one
    pass over the problems)."""

    grading: CodeGrading
    system_prompt: str | None = attrs.field(default=CODE_SYSTEM_PROMPT, kw_only=True)
    tag: str = attrs.field(default="code", kw_only=True)

    def make_group(self, problem: CodeProblem, /) -> EnvGroupBuilder:
        return CodeGroupBuilder(problem, self.renderer, self.grading, **self.group_settings())


@attrs.frozen(kw_only=True)
class CodeTask(HeldOutTask):
    """The code RL task (``RLDatasetBuilder``): the problems of ``problems_path`` split by
    ``seed`` (``n_test`` held out), ``batch_size`` problems × ``group_size`` replies per step;
    the test set is every held-out problem in one batch. Picklable.

    Example::

        train, test = await CodeTask(batch_size=4, group_size=8, n_batches=20)()
    """

    problems_path: str = CODE_PROBLEMS
    """The problems file (a .jsonl path, or tempering-assets:NAME)."""
    n_test: int = 8
    """Held-out problems (0: none, and the test set is the training problems)."""
    batch_size: int = 8
    """Problems per training batch."""
    seed: int = 0
    """Seeds the train/test split and the batch order; the test set samples with seed + 1."""
    grading: CodeGrading = attrs.field(factory=CodeGrading)
    system_prompt: str | None = CODE_SYSTEM_PROMPT
    """The system message before each problem (None or empty: none)."""

    def problems(self) -> tuple[list[CodeProblem], list[CodeProblem]]:
        """``(train, test)`` problems of this task."""
        return split_code_problems(load_code_problems(self.problems_path), n_test=self.n_test, seed=self.seed)

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        train, test = self.problems()
        dataset = CodeDataset(
            train, self.renderer(), self.grading, **self.batching(), system_prompt=self.system_prompt
        )
        return self.with_test(dataset, test)
