"""What the shipped RL task builders (``RLDatasetBuilder`` configs) share.

- :class:`PolicyTask`: the policy's model and chat format, which render the prompts.
- :class:`BatchedTask`: a problem task's batches and groups, for its dataset.
- :class:`HeldOutTask`: those, and the task's held-out test set (one
  batch, ``test_group_size`` replies a problem, sampled with ``seed + 1``).

Their fields are flags on the command line (``tempering rl dataset:NAME --dataset.FIELD``, or a
recipe's), each documented by the string under it.

Example::

    @attrs.frozen(kw_only=True)
    class MyTask(HeldOutTask):
        async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
            train = ProblemDataset(TRAIN, self.renderer(), exact_match, **self.batching())
            return self.with_test(train, TEST)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypedDict, TypeVar

import attrs
import tyro

from tempering.backend import load_renderer
from tempering.envs.problem import held_out
from tempering.model_info import TINY_MODEL
from tempering_protocols import Renderer

__all__ = ["BatchedTask", "Batching", "HeldOutTask", "PolicyTask"]

D = TypeVar("D", bound=attrs.AttrsInstance)


@attrs.frozen(kw_only=True)
class PolicyTask:
    """The policy's model and chat format, as a task builder's first fields."""

    base_model: Annotated[str | None, tyro.conf.Suppress] = None
    """The policy's base model, whose tokenizer renders the prompts. A trainer fills it from its
    own model (``--model.base-model``; :func:`tempering.policy.bind_policy`), so it is not a flag;
    set it only to use the task on its own (unset: ``tempering/tiny``)."""
    renderer_name: Annotated[str | None, tyro.conf.Suppress] = None
    """Chat format, filled like :attr:`base_model` (``--model.renderer-name``); unset: the one
    recommended for the base model."""

    @property
    def model(self) -> str:
        """The policy's base model in effect (:attr:`base_model`, or ``tempering/tiny``)."""
        return self.base_model or TINY_MODEL

    def renderer(self) -> Renderer:
        """The policy's renderer."""
        return load_renderer(self.model, self.renderer_name)


class Batching(TypedDict):
    """The batch settings a problem dataset (:class:`~tempering.envs.problem.SeededBatches`)
    takes from its task (:meth:`BatchedTask.batching`)."""

    batch_size: int
    group_size: int
    seed: int
    n_batches: int | None


@attrs.frozen(kw_only=True)
class BatchedTask(PolicyTask):
    """A problem task's training batches, as its dataset takes them (:meth:`batching`)."""

    batch_size: int = 16
    """Problems per training batch."""
    group_size: int = 8
    """Replies sampled per training problem (one group)."""
    n_batches: int | None = None
    """Training batches (default: one pass over the training problems)."""
    seed: int = 0
    """Seeds the batch order; the test set samples with seed + 1."""

    def batching(self) -> Batching:
        """This task's batch settings, for its dataset (``ProblemDataset(problems, renderer,
        grader, **self.batching())``)."""
        return Batching(
            batch_size=self.batch_size, group_size=self.group_size, seed=self.seed, n_batches=self.n_batches
        )


@attrs.frozen(kw_only=True)
class HeldOutTask(BatchedTask):
    """A problem task's training batches and its held-out test set."""

    test_group_size: int = 4
    """Replies sampled per held-out problem."""

    def with_test(self, train: D, test: Sequence[Any] | None) -> tuple[D, D | None]:
        """``(train, test set)``: ``train``'s settings over the ``test`` problems in one batch,
        ``test_group_size`` replies each, seeded by ``seed + 1`` (``None`` without ``test``)."""
        if test is None:
            return train, None
        return train, held_out(train, test, group_size=self.test_group_size, seed=self.seed + 1)
