"""What the agent tasks (tool use, rubric, twenty questions) share: fixed-list RL datasets,
chat rows written for SFT, and a sampled message completer of a checkpoint or a base model (a
judge, an answerer).

Example::

    ds = FixedGroups(builders, batch_size=4, n_batches=30, seed=0)
    same = SameEveryBatch((builder_a, builder_b), n_batches=20)
    write_chats(Path("data/train.jsonl"), conversations)
    judge = await sampled_completer(service, "tempering/tiny", path=judge_path, max_tokens=16)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from tempering.backend import ServiceClient, load_renderer, service_client
from tempering.envs.completer import SamplingMessageCompleter
from tempering.envs.task_base import PolicyTask
from tempering_protocols import EnvGroupBuilder, Message, RLDataset

__all__ = [
    "AgentTask",
    "FixedGroups",
    "HelperModel",
    "SameEveryBatch",
    "helper_field",
    "sampled_completer",
    "write_chats",
]


class FixedGroups:
    """An ``RLDataset`` over a fixed list of builders: ``n_batches`` batches of ``batch_size``,
    drawn in a seeded order (a fresh permutation each pass over the list)."""

    def __init__(
        self, builders: Sequence[EnvGroupBuilder], *, batch_size: int, n_batches: int, seed: int
    ) -> None:
        if not builders:
            raise ValueError("FixedGroups: no builders")
        self.builders = list(builders)
        self.batch_size = batch_size
        self.n_batches = n_batches
        n = len(self.builders)
        passes = -(-(batch_size * n_batches) // n)
        self._order = np.concatenate([np.random.default_rng([seed, p]).permutation(n) for p in range(passes)])

    @classmethod
    def one_batch(cls, builders: Sequence[EnvGroupBuilder], seed: int) -> FixedGroups:
        """Every builder in one batch (a test set)."""
        return cls(builders, batch_size=len(builders), n_batches=1, seed=seed)

    def __len__(self) -> int:
        return self.n_batches

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        picks = self._order[index * self.batch_size : (index + 1) * self.batch_size]
        return [self.builders[int(i)] for i in picks]


@attrs.frozen
class SameEveryBatch:
    """An ``RLDataset`` whose every batch is ``builders``, in order, for ``n_batches`` batches:
    the groups of one step differ from the last step's only by the sampling seeds the RL loop
    gives them, and by the policy (a learning history of each group's task, step after step)."""

    builders: tuple[EnvGroupBuilder, ...]
    n_batches: int

    def __len__(self) -> int:
        return self.n_batches

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        del index
        return list(self.builders)


def write_chats(path: Path, conversations: Sequence[Sequence[Message]]) -> Path:
    """Write ``{"messages": [...]}`` rows (chat JSONL) to ``path``; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = (json.dumps({"messages": list(messages)}) + "\n" for messages in conversations)
    path.write_text("".join(rows), encoding="utf-8")
    return path


async def sampled_completer(
    service: ServiceClient | None,
    base_model: str,
    *,
    path: str | None = None,
    renderer_name: str | None = None,
    max_tokens: int,
) -> SamplingMessageCompleter:
    """A :class:`~tempering.envs.completer.SamplingMessageCompleter` at temperature 1 of the
    sampler weights at ``path`` (a checkpoint of ``base_model``), else of ``base_model``'s own
    weights, served by ``service`` (default :func:`tempering.backend.service_client`)."""
    service = service or service_client()
    if path is not None:
        sampler = await service.create_sampling_client(model_path=path)
    else:
        sampler = await service.create_sampling_client(base_model=base_model)
    renderer = load_renderer(base_model, renderer_name)
    return SamplingMessageCompleter(sampler, renderer, max_tokens=max_tokens, temperature=1.0)


@attrs.frozen(kw_only=True)
class HelperModel:
    """A model an agent task samples besides the policy (a judge, an answerer): the sampler
    checkpoint ``path`` if given, else ``model``'s base weights, in the chat format
    ``renderer_name``. ``model`` and ``renderer_name`` default to the policy's.

    Example::

        RubricTask(judge_model=HelperModel(path=judge_sampler_path), service=service)
        TwentyQuestionsTask(answerer_model=HelperModel(model="Qwen/Qwen3-8B"))
    """

    path: str | None = None
    """A ``save_weights_for_sampler`` path of a checkpoint of ``model``."""
    model: str | None = None
    """Its base model (default: the policy's)."""
    renderer_name: str | None = None
    """Its renderer (default: the policy's renderer name, else the model's recommended one)."""


def helper_field() -> HelperModel:
    """An :class:`AgentTask` field holding a :class:`HelperModel` (default: the policy's base
    weights); anything else is refused by name when the task is built."""
    return attrs.field(factory=HelperModel, validator=attrs.validators.instance_of(HelperModel))


@attrs.frozen(kw_only=True)
class AgentTask(PolicyTask):
    """The fields an agent task (an ``RLDatasetBuilder``) shares: the policy's model and chat
    format, ``n_batches`` training batches of ``batch_size`` groups of ``group_size``, a test set
    of ``eval_samples`` episodes per item (only with ``test``; a recipe that evaluates by itself
    passes ``False``), and the ``service`` that serves a judge or an answerer."""

    batch_size: int = 8
    """Groups per training batch."""
    group_size: int = 8
    """Episodes per training item (one group)."""
    eval_samples: int = 2
    """Episodes per test item."""
    n_batches: int = 10
    """Training batches."""
    seed: int = 0
    """Seeds the batch order."""
    test: bool = True
    """Build the test set (a recipe that evaluates by itself passes False)."""
    service: ServiceClient | None = attrs.field(default=None, eq=False, repr=False)

    async def helper_completer(self, helper: HelperModel, *, max_tokens: int) -> SamplingMessageCompleter:
        """The completer of ``helper`` (:func:`sampled_completer`, served by ``service``), its
        model and renderer defaulting to the policy's."""
        return await sampled_completer(
            self.service,
            helper.model or self.model,
            path=helper.path,
            renderer_name=helper.renderer_name or self.renderer_name,
            max_tokens=max_tokens,
        )

    def datasets(
        self, train: Sequence[EnvGroupBuilder], test: Sequence[EnvGroupBuilder]
    ) -> tuple[RLDataset, RLDataset | None]:
        """``train`` as :class:`FixedGroups` of this task's shape; ``test`` in one batch (``None``
        without ``test`` or when empty)."""
        train_ds = FixedGroups(train, batch_size=self.batch_size, n_batches=self.n_batches, seed=self.seed)
        return train_ds, FixedGroups.one_batch(test, self.seed) if self.test and test else None
