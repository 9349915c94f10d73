"""Evaluators: run during training, return scalar metrics."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from tempering_protocols.backend import SamplingClient, TrainingClient

__all__ = ["SamplingClientEvaluator", "TrainingClientEvaluator"]


@runtime_checkable
class TrainingClientEvaluator(Protocol):
    """Evaluates with the training client (e.g. held-out NLL via ``forward``).

    Example::

        metrics = await evaluator(training_client)  # {"test/nll": 1.93}
    """

    async def __call__(self, training_client: TrainingClient, /) -> dict[str, float]: ...


@runtime_checkable
class SamplingClientEvaluator(Protocol):
    """Evaluates by sampling (e.g. accuracy of generated answers)."""

    async def __call__(self, sampling_client: SamplingClient, /) -> dict[str, float]: ...
