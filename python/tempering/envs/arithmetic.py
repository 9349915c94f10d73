"""Two-digit addition and subtraction as text: the demo's problem set and its RL task.

Problems are written ``"23+45="`` → ``"68"`` and ``"71-29="`` → ``"42"`` (operands 0..99,
subtraction never negative): the answer is short, so a tiny model learns it in minutes. Every
problem of that space is enumerated once and split by a seeded shuffle, so the held-out set
never shares a question with the training set and the split depends only on the seed.

- :func:`split_problems`: ``(train, test)`` lists of :class:`~tempering.envs.problem.Problem`.
- :func:`write_chat_jsonl`: problems as ``{"messages": [...]}`` rows for ``tempering sft``.
- :class:`ArithmeticProblems`: the RL task (``RLDatasetBuilder``), graded by exact match; on the
  command line it is ``tempering rl dataset:arithmetic-demo``.

Example::

    train, test = split_problems(seed=0, n_test=200)
    write_chat_jsonl(train, "sft.jsonl")
    rl_train, rl_test = await ArithmeticProblems(seed=0, n_test=200)()
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from tempering.envs.problem import Problem, ProblemDataset, exact_match
from tempering.envs.task_base import HeldOutTask
from tempering_protocols import RLDataset

__all__ = ["ArithmeticProblems", "ScaledExactMatch", "all_problems", "split_problems", "write_chat_jsonl"]


def all_problems(max_operand: int = 99) -> list[Problem]:
    """Every ``a+b=`` and ``a-b=`` (``a >= b``) with operands in ``0..max_operand``, in a fixed
    order: ``(max_operand + 1)**2`` additions, then the subtractions."""
    n = max_operand + 1
    adds = [Problem(f"{a}+{b}=", str(a + b)) for a in range(n) for b in range(n)]
    subs = [Problem(f"{a}-{b}=", str(a - b)) for a in range(n) for b in range(a + 1)]
    return adds + subs


def split_problems(
    *, seed: int = 0, n_test: int = 200, n_train: int | None = None, max_operand: int = 99
) -> tuple[list[Problem], list[Problem]]:
    """``(train, test)``: disjoint, drawn from :func:`all_problems` by a shuffle seeded with
    ``seed``; ``n_train`` (default: all the rest) caps the training list.

    Example::

        train, test = split_problems(seed=0, n_test=200)
        assert not {p.question for p in train} & {p.question for p in test}
    """
    problems = all_problems(max_operand)
    if not 0 < n_test < len(problems):
        raise ValueError(f"n_test must be in 1..{len(problems) - 1}, got {n_test}")
    order = np.random.default_rng([seed, 0xA817]).permutation(len(problems))
    test = [problems[int(i)] for i in order[:n_test]]
    rest = [problems[int(i)] for i in order[n_test:]]
    return (rest if n_train is None else rest[:n_train]), test


def write_chat_jsonl(problems: Sequence[Problem], path: str | os.PathLike[str]) -> Path:
    """Write ``{"messages": [user question, assistant answer]}`` rows; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for p in problems:
            row = {
                "messages": [
                    {"role": "user", "content": p.question},
                    {"role": "assistant", "content": p.answer},
                ]
            }
            f.write(json.dumps(row) + "\n")
    return out


@attrs.frozen
class ScaledExactMatch:
    """``coef * exact_match(response, answer)``: a picklable grader (``coef`` 0: no reward).

    Example::

        ScaledExactMatch(0.5)(" 68", "68")   # 0.5
    """

    coef: float

    def __call__(self, response: str, answer: str) -> float:
        return self.coef * exact_match(response, answer)


@attrs.frozen(kw_only=True)
class ArithmeticProblems(HeldOutTask):
    """The demo's RL task: ``batch_size`` training problems × ``group_size`` samples per step,
    reward ``reward_coef`` for the exact answer and 0 otherwise (``format_coef`` 0: at the
    default coefficient the reward is accuracy); the test set is the held-out split of
    :func:`split_problems` (``seed``, ``n_test``), ``test_group_size`` samples each, in one batch
    (``test_group_size`` 0: no test set). Picklable.

    The RL stage of ``tempering demo`` alone, from an SFT checkpoint, on the command line::

        tempering rl --model.init-state <save_state path> dataset:arithmetic-demo --num-steps 80

    Example::

        train, test = await ArithmeticProblems(batch_size=16, group_size=8)()
    """

    seed: int = 0
    """Seeds the train/test split (the demo's with the same value) and the batch order."""
    n_test: int = 200
    """Held-out problems (the test set)."""
    reward_coef: float = 1.0
    """Reward of an exact answer (0: no task reward, e.g. for pure distillation)."""

    def __attrs_post_init__(self) -> None:
        for name in ("n_test", "batch_size", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"ArithmeticProblems.{name} must be >= 1, got {getattr(self, name)}")
        if self.test_group_size < 0:
            raise ValueError(f"ArithmeticProblems.test_group_size must be >= 0, got {self.test_group_size}")

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        train, test = split_problems(seed=self.seed, n_test=self.n_test)
        grader = exact_match if self.reward_coef == 1.0 else ScaledExactMatch(self.reward_coef)
        train_ds = ProblemDataset(
            train, self.renderer(), grader, **self.batching(), tag="arithmetic", format_coef=0.0
        )
        return self.with_test(train_ds, test if self.test_group_size else None)
