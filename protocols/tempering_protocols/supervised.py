"""Supervised and preference dataset protocols."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import tinker

from tempering_protocols.types import LabeledComparison

__all__ = [
    "ComparisonDataset",
    "ComparisonDatasetBuilder",
    "SupervisedDataset",
    "SupervisedDatasetBuilder",
]


@runtime_checkable
class SupervisedDataset(Protocol):
    """Batches of training datums, deterministic for a given (epoch seed, index).

    Example::

        ds.set_epoch(0)
        batch = ds.get_batch(3)  # list of tinker.Datum with target_tokens and weights
    """

    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, seed: int, /) -> None:
        """Reshuffle for an epoch; the same seed gives the same batches."""
        ...


@runtime_checkable
class SupervisedDatasetBuilder(Protocol):
    """A serializable config that builds the train dataset and an optional held-out one."""

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]: ...


@runtime_checkable
class ComparisonDataset(Protocol):
    """Batches of labeled preference pairs, deterministic for a given (epoch seed, index)."""

    def get_batch(self, index: int, /) -> Sequence[LabeledComparison]: ...

    def __len__(self) -> int: ...

    def set_epoch(self, seed: int, /) -> None: ...


@runtime_checkable
class ComparisonDatasetBuilder(Protocol):
    """Builds the train comparisons and optional held-out comparisons."""

    def __call__(self) -> tuple[ComparisonDataset, ComparisonDataset | None]: ...
