"""Off-policy distillation on a teacher's top-K, as a trainer: collect the teacher's top-K over a
dataset of conversations, then train the student with soft-target cross-entropy on them.

The building blocks are :mod:`tempering.sft.topk_distill`'s; this module turns them into a run:

1. the student's and the teacher's tokenizers are compared (:func:`check_same_tokenizer`) before
   anything is sampled: a mismatch is :class:`TeacherTokenizerMismatchError`, naming the teacher;
2. each conversation is rendered with the student's renderer (``tokens_T``, ``weights_T``), and
   the teacher is asked once per conversation for its top ``K`` next tokens at every position
   (:func:`collect_topk_datums`, through any ``SamplingClient``: the local engine,
   ``tempering serve`` or the hosted service);
3. :func:`tempering.sft.train_supervised` trains on those ``[T, K]`` datums (``cross_entropy``
   with ``weights_T * probs_T_K``), with the held-out top-K cross-entropy (``test_topk/nll``)
   and the held-out NLL of the reference answers (``test/nll``) as evaluations.

The teacher may see other tokens than the student before the trained part: ``teacher_tokens``
(prompt distillation, where the teacher's prompt carries instructions the student's does not).
Its rows predicting the shared suffix are moved onto the student's (:func:`topk_targets`).

Shapes (docs/notation.md): ``T`` tokens of a sequence, ``K`` teacher tokens per position, ``D``
datums of a batch.

Example::

    config = TopKDistillConfig(run=RunConfig(log_dir="runs/topk"), teacher_model="tempering/tiny",
                               teacher_path=sampler_path, k=8, max_steps=50)
    result = asyncio.run(config())
    result.metrics[-1]["test_topk/nll"]
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt
import tinker

from tempering.assets import ASSET_PREFIX, resolve_data_path
from tempering.backend import ServiceClient, ending_session, load_tokenizer, service_client
from tempering.data import load_chat
from tempering.data.datums import conversations_to_datums
from tempering.renderers import get_renderer, render_supervised_batch_sync
from tempering.sft.topk_distill import check_same_tokenizer, teacher_topk, topk_datum
from tempering.sft.train import NLLEvaluator, train_supervised
from tempering.training import FineTuningConfig, TrainResult
from tempering_protocols import Message, Renderer, SamplingClient, TrainOnWhat

__all__ = [
    "DatumDataset",
    "TopKDistillConfig",
    "collect_topk_datums",
    "rendered",
    "topk_targets",
]

_MASK = -99999.0


async def topk_targets(
    teacher: SamplingClient,
    tokens_T: Sequence[int],
    weights_T: Sequence[float],
    k: int,
    *,
    teacher_tokens: Sequence[int] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The teacher's top ``k`` after every prefix of the student's ``tokens_T`` (``[T, k]``, as
    :func:`~tempering.sft.topk_distill.teacher_topk`). With ``teacher_tokens`` the teacher reads
    those instead; they must end with the student's tokens from the first trained one on (the
    shared suffix), and only the rows predicting that suffix are filled (the others are empty).

    Example::

        ids_T_K, lp_T_K = await topk_targets(teacher, student_tokens, weights, 8,
                                             teacher_tokens=system_prompt_tokens + student_tokens)
    """
    if teacher_tokens is None:
        return await teacher_topk(teacher, tokens_T, k)
    trained = np.flatnonzero(np.asarray(weights_T, dtype=np.float64) > 0)
    if trained.size == 0:
        raise ValueError("a sequence to distil needs at least one trained token (a weight > 0)")
    first = int(trained[0])
    n = len(tokens_T) - first  # the shared suffix: every trained token and what follows
    if first < 1 or len(teacher_tokens) < n + 1 or list(teacher_tokens[-n:]) != list(tokens_T[first:]):
        raise ValueError(
            f"the teacher's tokens must end with the student's {n} tokens from its first trained one "
            f"(position {first}), after at least one token of their own; check that both are rendered "
            "with the same renderer and differ only before the trained part"
        )
    t_ids, t_lp = await teacher_topk(teacher, teacher_tokens, k)
    ids_T_K = np.zeros((len(tokens_T), k), dtype=np.int64)
    lp_T_K = np.full((len(tokens_T), k), _MASK, dtype=np.float32)
    # Row first-1 (student) predicts tokens_T[first]; the teacher's row predicting the same token
    # is len(teacher_tokens)-n-1. The last row (past the end) stays empty in both.
    t0 = len(teacher_tokens) - n - 1
    ids_T_K[first - 1 : first - 1 + n] = t_ids[t0 : t0 + n]
    lp_T_K[first - 1 : first - 1 + n] = t_lp[t0 : t0 + n]
    return ids_T_K, lp_T_K


async def collect_topk_datums(
    teacher: SamplingClient,
    examples: Sequence[tuple[Sequence[int], Sequence[float]]],
    k: int,
    *,
    teacher_tokens: Sequence[Sequence[int]] | None = None,
    concurrency: int = 16,
) -> list[tinker.Datum]:
    """One ``[T, K]`` cross-entropy datum per ``(tokens_T, weights_T)`` example, its targets the
    teacher's top ``k`` (:func:`topk_targets`; ``teacher_tokens[i]``: what the teacher reads for
    example ``i``). At most ``concurrency`` teacher calls are in flight.

    Example::

        datums = await collect_topk_datums(teacher, [(tokens, weights)], k=8)
    """
    if teacher_tokens is not None and len(teacher_tokens) != len(examples):
        raise ValueError(f"{len(teacher_tokens)} teacher sequences for {len(examples)} examples")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> tinker.Datum:
        tokens_T, weights_T = examples[i]
        seen = None if teacher_tokens is None else teacher_tokens[i]
        async with gate:
            ids_T_K, lp_T_K = await topk_targets(teacher, tokens_T, weights_T, k, teacher_tokens=seen)
        return topk_datum(tokens_T, weights_T, ids_T_K, lp_T_K)

    return list(await asyncio.gather(*(one(i) for i in range(len(examples)))))


def rendered(
    renderer: Renderer, conversations: Sequence[Sequence[Message]], train_on_what: TrainOnWhat
) -> list[tuple[list[int], list[float]]]:
    """``(tokens_T, weights_T)`` of each conversation, rendered by ``renderer``."""
    examples = render_supervised_batch_sync(renderer, conversations, train_on_what)
    return [(e.model_input.to_ints(), [float(w) for w in e.weights]) for e in examples]


@attrs.define
class DatumDataset:
    """A ``SupervisedDataset`` over datums already built: ``len(datums) // batch_size`` batches an
    epoch (the remainder is dropped unless ``keep_last``: a held-out set), their order shuffled by
    ``seed`` and the epoch.

    Example::

        ds = DatumDataset(datums, batch_size=8, seed=0)
        ds.set_epoch(0); ds.get_batch(0)
    """

    datums: Sequence[tinker.Datum]
    batch_size: int
    seed: int = 0
    keep_last: bool = False
    _order: list[int] = attrs.field(factory=list[int], init=False)

    def __attrs_post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        self.set_epoch(0)

    def set_epoch(self, seed: int, /) -> None:
        rng = np.random.default_rng([self.seed, seed])
        self._order = [int(i) for i in rng.permutation(len(self.datums))]

    def __len__(self) -> int:
        if self.keep_last:
            return -(-len(self.datums) // self.batch_size)
        return len(self.datums) // self.batch_size

    def get_batch(self, index: int, /) -> list[tinker.Datum]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        picked = self._order[index * self.batch_size : (index + 1) * self.batch_size]
        return [self.datums[i] for i in picked]


@attrs.frozen(kw_only=True)
class TopKDistillConfig(FineTuningConfig):
    """Off-policy top-K distillation of ``teacher_model`` (at ``teacher_path``, sampler weights,
    if given) into ``model`` (the student) on the conversations at ``train_path``; see the module
    docstring. Picklable; calling it (``await config()``) runs it. ``run``, ``model``, ``adam``,
    ``num_epochs`` and ``max_steps`` are :class:`~tempering.training.FineTuningConfig`'s.

    Example::

        config = TopKDistillConfig(run=RunConfig(log_dir="runs/topk"), teacher_path=path, k=8)
        result = asyncio.run(config())
    """

    teacher_model: str = "tempering/tiny"
    """The teacher's base model; its tokenizer must be the student's."""
    teacher_path: str | None = None
    """The teacher's sampler weights (``…/sampler_weights/…``); ``None``: ``teacher_model`` itself."""
    train_path: str = ASSET_PREFIX + "arithmetic_chat.jsonl"
    """Conversations whose assistant part is distilled (the teacher's top-K on its tokens)."""
    test_path: str | None = ASSET_PREFIX + "arithmetic_chat_test.jsonl"
    """Held-out conversations: ``test_topk/nll`` (the teacher's top-K) and ``test/nll`` (the text)."""
    k: int = 20
    """Teacher tokens per position (``K``)."""
    batch_size: int = 16
    """Conversations per optimizer step."""
    train_on_what: TrainOnWhat = attrs.field(
        default=TrainOnWhat.LAST_ASSISTANT_MESSAGE, converter=TrainOnWhat
    )
    """Which tokens are distilled."""
    seed: int = 0
    """Seeds the batch order."""

    def __attrs_post_init__(self) -> None:
        for name in ("k", "batch_size", "num_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"TopKDistillConfig.{name} must be >= 1, got {getattr(self, name)}")

    async def __call__(self, service: ServiceClient | None = None) -> TrainResult:
        check_same_tokenizer(
            load_tokenizer(self.model.base_model),
            load_tokenizer(self.teacher_model),
            teacher_name=self.teacher_path or self.teacher_model,
        )  # before any sampling
        if service is None:
            with ending_session(service_client()) as owned:
                return await self._run(owned)
        return await self._run(service)

    async def _run(self, service: ServiceClient) -> TrainResult:
        teacher = await service.create_sampling_client(
            model_path=self.teacher_path, base_model=None if self.teacher_path else self.teacher_model
        )
        renderer = get_renderer(self.model.renderer(), self.model.tokenizer())
        train = load_chat(resolve_data_path(self.train_path)).items
        datums = await collect_topk_datums(teacher, rendered(renderer, train, self.train_on_what), self.k)
        train_ds = DatumDataset(datums, self.batch_size, self.seed)
        if len(train_ds) < 1:
            raise ValueError(f"{self.train_path}: fewer conversations ({len(datums)}) than one batch")
        evaluators: list[NLLEvaluator] = []
        if self.test_path is not None:
            test = load_chat(resolve_data_path(self.test_path)).items
            test_examples = rendered(renderer, test, self.train_on_what)
            test_topk = await collect_topk_datums(teacher, test_examples, self.k)
            hard = conversations_to_datums(renderer, test, self.train_on_what)
            evaluators = [
                NLLEvaluator(DatumDataset(test_topk, self.batch_size, keep_last=True), name="test_topk"),
                NLLEvaluator(DatumDataset(hard, self.batch_size, keep_last=True), name="test"),
            ]
        config = self.resolved("sft")
        return await train_supervised(
            config, run=self.run, model=self.model, adam=config.adam, train=train_ds,
            num_epochs=self.num_epochs, max_steps=self.max_steps, training_evaluators=evaluators,
            service=service,
        )  # fmt: skip
