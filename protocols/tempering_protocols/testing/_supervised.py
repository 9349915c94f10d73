"""Conformance checks for ``SupervisedDataset`` and ``SupervisedDatasetBuilder``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import tinker

from tempering_protocols.supervised import SupervisedDataset, SupervisedDatasetBuilder
from tempering_protocols.testing._base import (
    ConformanceError,
    call,
    expect_type,
    name_of,
    pickle_round_trip,
)
from tempering_protocols.testing._structure import check_object_implements, object_problem

__all__ = ["check_supervised_dataset", "check_supervised_dataset_builder"]

_REQUIRED_INPUTS = {"target_tokens": "int64", "weights": "float32"}


def _tensor_length(tensor: tinker.TensorData) -> int:
    """Length of the first axis, read from the shape when there is one (no densifying)."""
    if tensor.shape is not None:
        return tensor.shape[0] if tensor.shape else 0
    return len(tensor.data)


def _tensor_key(tensor: tinker.TensorData) -> tuple[object, ...]:
    """What identifies a tensor's value; works for dense and sparse tensors without torch."""
    return (
        tensor.dtype,
        None if tensor.shape is None else tuple(tensor.shape),
        tuple(tensor.data),
        None if tensor.sparse_crow_indices is None else tuple(tensor.sparse_crow_indices),
        None if tensor.sparse_col_indices is None else tuple(tensor.sparse_col_indices),
    )


def _datum_difference(a: tinker.Datum, b: tinker.Datum) -> str | None:
    """How two datums differ (model input tokens, then loss inputs), or ``None`` when equal."""
    if a.model_input != b.model_input:
        return "model_input differs"
    if sorted(a.loss_fn_inputs) != sorted(b.loss_fn_inputs):
        return f"loss_fn_inputs keys differ: {sorted(a.loss_fn_inputs)} vs {sorted(b.loss_fn_inputs)}"
    for key in sorted(a.loss_fn_inputs):
        if _tensor_key(a.loss_fn_inputs[key]) != _tensor_key(b.loss_fn_inputs[key]):
            return f"loss_fn_inputs[{key!r}] differs"
    return None


def _batch_difference(a: Sequence[tinker.Datum], b: Sequence[tinker.Datum]) -> str | None:
    if len(a) != len(b):
        return f"{len(a)} datums vs {len(b)}"
    for d, (x, y) in enumerate(zip(a, b, strict=True)):
        difference = _datum_difference(x, y)
        if difference is not None:
            return f"datum {d}: {difference}"
    return None


def _check_datum(datum: tinker.Datum, where: str) -> None:
    n = datum.model_input.length
    for key, dtype in _REQUIRED_INPUTS.items():
        tensor = datum.loss_fn_inputs.get(key)
        if tensor is None:
            raise ConformanceError(
                "supervised/missing-loss-input",
                f"{where} has no loss_fn_inputs[{key!r}] (has {sorted(datum.loss_fn_inputs)})",
            )
        if tensor.dtype != dtype:
            raise ConformanceError(
                "supervised/loss-input-dtype",
                f"{where}: loss_fn_inputs[{key!r}] has dtype {tensor.dtype}, expected {dtype}",
            )
        length = _tensor_length(tensor)
        if length != n:
            raise ConformanceError(
                "supervised/misaligned",
                f"{where}: loss_fn_inputs[{key!r}] has length {length} but model_input has {n} tokens; "
                "each input token needs one target and one weight",
            )
    weights = cast(list[float], datum.loss_fn_inputs["weights"].data)
    if not all(math.isfinite(w) and w >= 0.0 for w in weights):
        raise ConformanceError("supervised/weights-range", f"{where}: weights must be finite and >= 0")


def _get_batch(dataset: SupervisedDataset, name: str, index: int) -> list[tinker.Datum]:
    batch = call("supervised/raised", f"{name}.get_batch({index})", lambda: dataset.get_batch(index))
    expect_type(
        batch,
        Sequence[tinker.Datum],
        rule="supervised/batch-type",
        what=f"{name}.get_batch({index}) must return a sequence of tinker.Datum",
    )
    if not batch:
        raise ConformanceError("supervised/empty-batch", f"{name}.get_batch({index}) returned no datums")
    return list(batch)


def _length(dataset: SupervisedDataset, name: str) -> int:
    try:
        n = len(dataset)
    except Exception as exc:
        raise ConformanceError("supervised/len", f"len({name}) failed: {type(exc).__name__}: {exc}") from exc
    if n <= 0:
        raise ConformanceError("supervised/len", f"len({name}) is 0; the kit needs a batch to check")
    return n


def check_supervised_dataset(
    dataset: object, /, *, indices: Sequence[int] | None = None, seed: int = 0
) -> None:
    """Check a ``SupervisedDataset``: batch types, datum layout, and determinism.

    For each index in ``indices`` (default: the first and the last batch) after
    ``set_epoch(seed)``: the batch must be a non-empty sequence of ``tinker.Datum``, each with
    ``loss_fn_inputs["target_tokens"]`` (int64) and ``["weights"]`` (float32, finite, >= 0),
    both as long as ``model_input``. Fetching the batch again, and again after
    ``set_epoch(seed + 1)`` then ``set_epoch(seed)``, must give equal datums (model input
    tokens and every loss-input array).
    Rules: ``supervised/len``, ``supervised/batch-type``, ``supervised/empty-batch``,
    ``supervised/missing-loss-input``, ``supervised/loss-input-dtype``, ``supervised/misaligned``,
    ``supervised/weights-range``, ``supervised/deterministic``, ``supervised/raised``.

    Example::

        check_supervised_dataset(MyChatDataset(batch_size=2), indices=[0, 3])
    """
    name = name_of(dataset)
    check_object_implements(dataset, SupervisedDataset)
    the_dataset = cast(SupervisedDataset, dataset)
    n = _length(the_dataset, name)
    indices_checked = sorted({0, n - 1}) if indices is None else list(indices)

    def set_epoch(epoch_seed: int) -> None:
        call(
            "supervised/raised",
            f"{name}.set_epoch({epoch_seed})",
            lambda: the_dataset.set_epoch(epoch_seed),
        )

    set_epoch(seed)
    first = {index: _get_batch(the_dataset, name, index) for index in indices_checked}
    for index, batch in first.items():
        for d, datum in enumerate(batch):
            _check_datum(datum, f"{name}.get_batch({index})[{d}]")
        difference = _batch_difference(batch, _get_batch(the_dataset, name, index))
        if difference is not None:
            raise ConformanceError(
                "supervised/deterministic",
                f"{name}.get_batch({index}) called twice gave different data ({difference})",
            )
    set_epoch(seed + 1)
    for index in indices_checked:
        _get_batch(the_dataset, name, index)
    set_epoch(seed)
    for index, batch in first.items():
        difference = _batch_difference(batch, _get_batch(the_dataset, name, index))
        if difference is not None:
            raise ConformanceError(
                "supervised/deterministic",
                f"{name}.get_batch({index}) differs after set_epoch({seed}) again ({difference}); "
                "the same seed must give the same batches",
            )


def check_supervised_dataset_builder(
    builder: object, /, *, indices: Sequence[int] | None = None, seed: int = 0
) -> None:
    """Check a ``SupervisedDatasetBuilder``: it pickles, and its datasets pass the dataset check.

    Rules: ``supervised-builder/pickle``, ``supervised-builder/return-type``,
    ``supervised-builder/raised``, and the ``supervised/*`` rules for both datasets.

    Example::

        check_supervised_dataset_builder(MyChatDatasetConfig(batch_size=2))
    """
    name = name_of(builder)
    check_object_implements(builder, SupervisedDatasetBuilder)
    pickle_round_trip(builder, rule="supervised-builder/pickle", what=name)
    the_builder = cast(SupervisedDatasetBuilder, builder)
    built = call("supervised-builder/raised", f"{name}()", the_builder)
    what = f"{name}() must return (SupervisedDataset, SupervisedDataset | None)"
    expect_type(built, tuple[object, object], rule="supervised-builder/return-type", what=what)
    train, test = built
    for role, dataset in (("train", train), ("test", test)):
        if dataset is None and role == "test":
            continue
        problem = object_problem(dataset, SupervisedDataset)
        if problem is not None:
            raise ConformanceError("supervised-builder/return-type", f"{what}: the {role} dataset: {problem}")
        check_supervised_dataset(dataset, indices=indices, seed=seed)
