"""Ready-made RL dataset builders (picklable configs whose call builds ``(train, test)``).

=============================  ===========================================================
builder                        task
=============================  ===========================================================
:class:`LowercaseTask`         "reply in lowercase letters", reward = fraction of lowercase
                               letters (dense; a tiny model learns it in a few steps)
:class:`ArithmeticTask`        the shipped arithmetic questions, reward = the first number
                               of the answer equals the reference
:class:`ChatProblems`          any chat file's questions (first user turn → the reply),
                               reward ``reward_coef`` × exact match (0: none, for distillation)
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
from tempering.envs.task_base import BatchedTask, HeldOutTask
from tempering_protocols import RLDataset

__all__ = ["ArithmeticTask", "ChatProblems", "LowercaseTask"]

_LOWERCASE_PROMPTS = ("Reply in lowercase.", "Say a word.", "Write letters.", "Answer quietly.")


@attrs.frozen(kw_only=True)
class LowercaseTask(BatchedTask):
    """``batch_size`` prompts × ``group_size`` samples, rewarded by the fraction of lowercase
    letters in the reply; the test set is the same prompts (``n_test_batches`` batches)."""

    batch_size: int = 4
    """Prompts per training batch."""
    n_batches: int = 1000
    """Training batches."""
    n_test_batches: int = 1
    """Test batches (the same prompts, sampled with seed + 1)."""

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        problems = [Problem(q, "") for q in _LOWERCASE_PROMPTS]
        train = ProblemDataset(
            problems, self.renderer(), lowercase_fraction, **self.batching(), tag="lowercase", format_coef=0.0
        )
        return train, attrs.evolve(train, n_batches=self.n_test_batches, seed=self.seed + 1)


@attrs.frozen(kw_only=True)
class ArithmeticTask(BatchedTask):
    """The shipped arithmetic questions (``tempering.assets``): first user turn → reference
    answer, graded by :func:`first_number_match`; the held-out file is the test set, in one
    batch of ``group_size`` replies a question."""

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        test_items = chat_problems("tempering-assets:arithmetic_chat_test.jsonl")
        train = ProblemDataset(
            chat_problems("tempering-assets:arithmetic_chat.jsonl"),
            self.renderer(),
            first_number_match,
            **self.batching(),
            tag="arithmetic",
        )
        return train, attrs.evolve(train, problems=test_items, n_batches=1, seed=self.seed + 1)


def chat_problems(path: str) -> list[Problem]:
    """``Problem(first user turn, the reply to it)`` of each conversation in the chat file at
    ``path`` (``tempering-assets:<name>`` names a shipped file) that starts with a user turn
    answered by the assistant."""
    from tempering.assets import resolve_data_path
    from tempering.data import load_chat

    out: list[Problem] = []
    for convo in load_chat(resolve_data_path(path)).items:
        messages = list(convo)
        if len(messages) >= 2 and messages[0]["role"] == "user" and messages[1]["role"] == "assistant":
            out.append(Problem(messages[0]["content"], messages[1]["content"]))
    return out


@attrs.frozen(kw_only=True)
class ChatProblems(HeldOutTask):
    """The questions of a chat file as an RL task: each conversation's first user turn, graded
    against the assistant's reply to it by exact match × ``reward_coef`` (0: no task reward, e.g.
    when a teacher's logprobs are the only signal); ``test_path``'s questions are the test set
    (``test_group_size`` replies each). Picklable; groups are tagged ``tag``.

    Example::

        train, test = await ChatProblems(train_path="tempering-assets:arithmetic_chat.jsonl",
                                         test_path="tempering-assets:arithmetic_chat_test.jsonl")()
    """

    train_path: str
    """Training conversations (JSONL, JSON, Parquet, Arrow; ``tempering-assets:<name>``)."""
    test_path: str | None = None
    """Held-out conversations (``None``: no test set)."""
    reward_coef: float = 1.0
    """Reward of an exact answer."""
    tag: str = "chat"
    """The groups' logging tag."""

    def __attrs_post_init__(self) -> None:
        if self.reward_coef < 0:
            raise ValueError(f"ChatProblems.reward_coef must be >= 0, got {self.reward_coef}")

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        from tempering.envs.arithmetic import ScaledExactMatch

        train = chat_problems(self.train_path)
        if not train:
            raise ValueError(
                f"ChatProblems.train_path {self.train_path}: no conversation starts with a user turn "
                "answered by the assistant"
            )
        grader = ScaledExactMatch(self.reward_coef)
        train_ds = ProblemDataset(
            train, self.renderer(), grader, **self.batching(), tag=self.tag, format_coef=0.0
        )
        return self.with_test(train_ds, chat_problems(self.test_path) if self.test_path else None)
