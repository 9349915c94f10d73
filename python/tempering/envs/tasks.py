"""Ready-made RL dataset builders (picklable configs whose call builds ``(train, test)``).

=============================  ===========================================================
builder                        task
=============================  ===========================================================
:class:`LowercaseTask`         "reply in lowercase letters", reward = fraction of lowercase
                               letters (dense; a tiny model learns it in a few steps)
:class:`ArithmeticTask`        the shipped arithmetic questions, reward = the first number
                               of the answer equals the reference
=============================  ===========================================================

Example::

    train, test = await ArithmeticTask(batch_size=16, group_size=8)()
"""

from __future__ import annotations

import attrs

from tempering.envs.problem import (
    Problem,
    ProblemDataset,
    first_number_match,
    lowercase_fraction,
)
from tempering.envs.task_base import PolicyTask
from tempering_protocols import RLDataset

__all__ = ["ArithmeticTask", "LowercaseTask"]

_LOWERCASE_PROMPTS = ("Reply in lowercase.", "Say a word.", "Write letters.", "Answer quietly.")


@attrs.frozen(kw_only=True)
class LowercaseTask(PolicyTask):
    """``batch_size`` prompts × ``group_size`` samples, rewarded by the fraction of lowercase
    letters in the reply; the test set is the same prompts (``n_test_batches`` batches)."""

    batch_size: int = 4
    """Prompts per training batch."""
    group_size: int = 8
    """Replies sampled per prompt (one group)."""
    n_batches: int = 1000
    """Training batches."""
    n_test_batches: int = 1
    """Test batches (the same prompts, sampled with seed + 1)."""
    seed: int = 0
    """Seeds the batch order."""

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        problems = [Problem(q, "") for q in _LOWERCASE_PROMPTS]
        train = ProblemDataset(
            problems,
            self.renderer(),
            lowercase_fraction,
            batch_size=self.batch_size,
            group_size=self.group_size,
            seed=self.seed,
            n_batches=self.n_batches,
            tag="lowercase",
            format_coef=0.0,
        )
        return train, attrs.evolve(train, n_batches=self.n_test_batches, seed=self.seed + 1)


@attrs.frozen(kw_only=True)
class ArithmeticTask(PolicyTask):
    """The shipped arithmetic questions (``tempering.assets``): first user turn → reference
    answer, graded by :func:`first_number_match`; the held-out file is the test set."""

    batch_size: int = 16
    """Questions per training batch."""
    group_size: int = 8
    """Replies sampled per question (one group; the test set's too)."""
    n_batches: int | None = None
    """Training batches (default: one pass over the questions)."""
    seed: int = 0
    """Seeds the batch order; the test set samples with seed + 1."""

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        from tempering import assets
        from tempering.data import load_chat

        def problems(name: str) -> list[Problem]:
            out: list[Problem] = []
            for convo in load_chat(assets.path(name)).items:
                messages = list(convo)
                if len(messages) >= 2 and messages[0]["role"] == "user":
                    out.append(Problem(messages[0]["content"], messages[1]["content"]))
            return out

        test_items = problems("arithmetic_chat_test.jsonl")
        train = ProblemDataset(
            problems("arithmetic_chat.jsonl"),
            self.renderer(),
            first_number_match,
            batch_size=self.batch_size,
            group_size=self.group_size,
            seed=self.seed,
            n_batches=self.n_batches,
            tag="arithmetic",
        )
        return train, attrs.evolve(train, problems=test_items, n_batches=1, seed=self.seed + 1)
