"""Correct and deliberately broken supervised datasets, one broken class per rule."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence

import attrs
import numpy as np
import tinker

from tempering_protocols import SupervisedDataset
from tempering_protocols.testing import check_supervised_dataset, check_supervised_dataset_builder


def make_datum(tokens: Sequence[int], weights: Sequence[float] | None = None) -> tinker.Datum:
    """The usual next-token layout: inputs ``tokens[:-1]``, targets ``tokens[1:]``."""
    n = len(tokens) - 1
    weights_T = np.ones(n, np.float32) if weights is None else np.asarray(weights, np.float32)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(list(tokens[:-1])),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(np.asarray(tokens[1:], np.int64)),
            "weights": tinker.TensorData.from_numpy(weights_T),
        },
    )


@attrs.define
class TinyDataset:
    """A correct dataset: batch ``i`` of epoch ``seed`` is drawn from ``Random(f"{seed}/{i}")``."""

    n_batches: int = 3
    batch_size: int = 2
    seed: int = 0

    def datum(self, rng: random.Random) -> tinker.Datum:
        return make_datum([rng.randrange(100) for _ in range(rng.randrange(3, 9))])

    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]:
        rng = random.Random(f"{self.seed}/{index}")
        return [self.datum(rng) for _ in range(self.batch_size)]

    def __len__(self) -> int:
        return self.n_batches

    def set_epoch(self, seed: int, /) -> None:
        self.seed = seed


@attrs.frozen
class TinyDatasetBuilder:
    """A correct builder: a train dataset and a one-batch test dataset."""

    batch_size: int = 2

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        return TinyDataset(batch_size=self.batch_size), TinyDataset(n_batches=1, batch_size=self.batch_size)


@attrs.frozen
class NoSetEpoch:
    """An RL-style dataset of datums: it cannot be reshuffled per epoch."""

    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]:
        return [make_datum([1, 2, 3])]

    def __len__(self) -> int:
        return 1


@attrs.define
class EmptySupervised(TinyDataset):
    def __len__(self) -> int:
        return 0


@attrs.define
class ReturnsTokenLists(TinyDataset):
    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]:
        return [[1, 2, 3]]  # pyright: ignore[reportReturnType] -- deliberately broken


@attrs.define
class NoDatums(TinyDataset):
    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]:
        return []


@attrs.define
class MissingWeights(TinyDataset):
    def datum(self, rng: random.Random) -> tinker.Datum:
        datum = super().datum(rng)
        return tinker.Datum(datum.model_input, {"target_tokens": datum.loss_fn_inputs["target_tokens"]})


@attrs.define
class FloatTargets(TinyDataset):
    def datum(self, rng: random.Random) -> tinker.Datum:
        datum = super().datum(rng)
        targets = datum.loss_fn_inputs["target_tokens"].to_numpy().astype(np.float32)
        inputs = {**datum.loss_fn_inputs, "target_tokens": tinker.TensorData.from_numpy(targets)}
        return tinker.Datum(datum.model_input, inputs)


@attrs.define
class AllTokensAsTargets(TinyDataset):
    """Targets and weights for every token, including the last input: one too many."""

    def datum(self, rng: random.Random) -> tinker.Datum:
        tokens = [rng.randrange(100) for _ in range(5)]
        return tinker.Datum(
            model_input=tinker.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": tinker.TensorData.from_numpy(np.asarray(tokens, np.int64)),
                "weights": tinker.TensorData.from_numpy(np.ones(5, np.float32)),
            },
        )


@attrs.define
class NegativeWeights(TinyDataset):
    def datum(self, rng: random.Random) -> tinker.Datum:
        return make_datum([1, 2, 3, 4], weights=[1.0, -1.0, 1.0])


@attrs.define
class UnseededDataset(TinyDataset):
    """Draws from one running generator: the batch depends on how often it was asked."""

    rng: random.Random = attrs.field(factory=lambda: random.Random(0))

    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]:
        return [self.datum(self.rng) for _ in range(self.batch_size)]


@attrs.define
class CountsEpochs(TinyDataset):
    """Stable within an epoch, but keyed by how many epochs began rather than by the seed."""

    epochs: itertools.count[int] = attrs.field(factory=itertools.count)
    epoch: int = 0

    def set_epoch(self, seed: int, /) -> None:
        self.epoch = next(self.epochs)

    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]:
        rng = random.Random(f"{self.epoch}/{index}")
        return [self.datum(rng) for _ in range(self.batch_size)]


@attrs.define
class LastBatchOutOfRange(TinyDataset):
    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]:
        if index == self.n_batches - 1:
            raise IndexError(f"batch {index} runs past the data")
        return super().get_batch(index)


@attrs.frozen
class UnpicklableBuilder(TinyDatasetBuilder):
    load: Callable[[], list[str]] = attrs.field(factory=lambda: lambda: [])


@attrs.frozen
class BuilderReturnsList(TinyDatasetBuilder):
    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        return [TinyDataset()]  # pyright: ignore[reportReturnType] -- deliberately broken


@attrs.frozen
class BuilderRaises(TinyDatasetBuilder):
    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        raise PermissionError("data/train.jsonl")


CASES: list[tuple[str, Callable[[], object], Callable[[object], object]]] = [
    # (rule, makes the broken object, the check that must fail with the rule)
    ("protocol/missing-member", NoSetEpoch, check_supervised_dataset),
    ("supervised/len", EmptySupervised, check_supervised_dataset),
    ("supervised/batch-type", ReturnsTokenLists, check_supervised_dataset),
    ("supervised/empty-batch", NoDatums, check_supervised_dataset),
    ("supervised/missing-loss-input", MissingWeights, check_supervised_dataset),
    ("supervised/loss-input-dtype", FloatTargets, check_supervised_dataset),
    ("supervised/misaligned", AllTokensAsTargets, check_supervised_dataset),
    ("supervised/weights-range", NegativeWeights, check_supervised_dataset),
    ("supervised/deterministic", UnseededDataset, check_supervised_dataset),
    ("supervised/deterministic", CountsEpochs, check_supervised_dataset),
    ("supervised/raised", LastBatchOutOfRange, check_supervised_dataset),
    ("supervised-builder/pickle", UnpicklableBuilder, check_supervised_dataset_builder),
    ("supervised-builder/return-type", BuilderReturnsList, check_supervised_dataset_builder),
    ("supervised-builder/raised", BuilderRaises, check_supervised_dataset_builder),
]
