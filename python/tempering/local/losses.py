"""The local engine's side of the built-in losses: the checks that turn a list of datums into
one padded batch. The losses themselves (names, inputs, config defaults, elementwise terms) are
:data:`tempering.losses.LOSSES`, shared with the RL loop and the CLI; the table of formulas is
there and in docs/rl.md.

Shapes of one datum (``T`` = number of input tokens):

=======================  =========================  =====================================
field                    shape                      meaning
=======================  =========================  =====================================
``model_input``          ``T``                      input tokens
``target_tokens``        ``T`` or ``T, K``          token predicted at each position
``weights``              same as ``target_tokens``  cross_entropy weight per target
``logprobs``             ``T``                      sampler's logprob of each target
``advantages``           ``T``                      advantage of each target
``sequence_ratio_mask``  ``T``                      gspo: 1 on the tokens of the sequence ratio
=======================  =========================  =====================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import tinker
import torch

from tempering.local.errors import DatumError, LossConfigError, UnknownLossError
from tempering.losses import LOSSES, LossSpec

__all__ = [
    "BUILTIN_LOSSES",
    "Batch",
    "BuiltinLoss",
    "CheckedDatum",
    "build_batch",
    "check_data",
    "get_loss",
    "pad_batch",
    "resolve_config",
]

BuiltinLoss = LossSpec
"""One built-in loss (:class:`tempering.losses.LossSpec`)."""

BUILTIN_LOSSES: Mapping[str, LossSpec] = LOSSES
"""The losses the local engine implements: every one of :data:`tempering.losses.LOSSES`."""


def get_loss(name: str) -> BuiltinLoss:
    """The built-in loss called ``name``; :class:`UnknownLossError` if there is none."""
    loss = BUILTIN_LOSSES.get(name)
    if loss is None:
        raise UnknownLossError(
            f"unknown loss {name!r}: the local engine implements {', '.join(BUILTIN_LOSSES)}; "
            "use forward_backward_custom for anything else"
        )
    return loss


def resolve_config(loss: BuiltinLoss, config: Mapping[str, float | str] | None) -> dict[str, float]:
    """The loss's config: its defaults, overridden by ``config`` (whose keys must be known)."""
    resolved = dict(loss.config_defaults)
    for key, value in (config or {}).items():
        if key not in loss.config_defaults:
            known = ", ".join(loss.config_defaults) or "none"
            raise LossConfigError(f"loss {loss.name!r} takes no config key {key!r} (it takes: {known})")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LossConfigError(f"loss {loss.name!r}: config {key!r} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise LossConfigError(
                f"loss {loss.name!r}: config {key!r} must be a finite number, got {value!r}"
            )
        resolved[key] = float(value)
    return resolved


@dataclass(frozen=True)
class Batch:
    """Datums padded into one batch (``B`` datums, ``L`` = longest, ``K`` = widest target).

    ========================  ===========  ============================================
    field                     shape        meaning
    ========================  ===========  ============================================
    ``input_ids``             ``B, L``     tokens, right-padded with 0
    ``attention_mask``        ``B, L``     1 on real tokens; None when nothing is padded
    ``targets``               ``B, L, K``  target tokens, padded with 0
    ``mask``                  ``B, L, K``  1.0 on real targets
    ``inputs[key]``           ``B, L, K``  float loss inputs, padded with 0
    ``gradient``              ``B, L``     where the loss can have a gradient (None: anywhere)
    ========================  ===========  ============================================
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    targets: torch.Tensor
    mask: torch.Tensor
    inputs: dict[str, torch.Tensor]
    target_shapes: list[tuple[int, ...]]
    num_tokens: int
    gradient: torch.Tensor | None = None
    """The positions where any of the loss's ``gradient_from`` inputs is nonzero for some target
    (elsewhere its gradient is zero, so the trainer need not build the backward pass there);
    None when the loss may have a gradient at any position."""


def _as_array(datum_index: int, key: str, value: tinker.TensorData) -> npt.NDArray[np.generic]:
    try:
        array = np.asarray(value.to_numpy())
        if value.shape is not None and value.sparse_crow_indices is None:
            array = array.reshape(value.shape)
    except Exception as exc:
        raise DatumError(datum_index, key, f"cannot be read as an array: {exc}") from exc
    return array


@dataclass(frozen=True)
class CheckedDatum:
    """One datum that passed :func:`check_data`: its tokens, targets and float loss inputs."""

    tokens: npt.NDArray[np.int64]
    target: npt.NDArray[np.int64]
    inputs: dict[str, npt.NDArray[np.float32]]


def check_data(
    data: Sequence[tinker.Datum],
    loss: BuiltinLoss | None,
    *,
    vocab_size: int,
    max_length: int,
) -> list[CheckedDatum]:
    """Check every datum against ``loss`` (None: a custom loss, which needs only
    ``target_tokens``). Raises :class:`DatumError` naming the first datum and field that don't
    fit; nothing is computed before all are checked."""
    if not data:
        raise ValueError("no data: pass at least one datum")
    name = repr(loss.name) if loss is not None else "custom"
    required = loss.required if loss is not None else ()
    optional = loss.per_token_config if loss is not None else ()
    allows_topk = loss.allows_topk if loss is not None else True
    checked: list[CheckedDatum] = []
    for i, datum in enumerate(data):
        if not isinstance(datum, tinker.Datum):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise DatumError(i, "datum", f"expected tinker.Datum, got {type(datum).__name__}")
        try:
            tokens = np.asarray(datum.model_input.to_ints(), dtype=np.int64)
        except ValueError as exc:
            raise DatumError(i, "model_input", f"only token chunks are supported here ({exc})") from exc
        n = len(tokens)
        if n == 0:
            raise DatumError(i, "model_input", "is empty")
        if n > max_length:
            raise DatumError(
                i,
                "model_input",
                f"has {n} tokens; the model's context (max_position_embeddings) is {max_length}: "
                "shorten the datum or train a model with a longer context",
            )
        _check_ids(i, "model_input", tokens, vocab_size)
        fields = datum.loss_fn_inputs
        if "target_tokens" not in fields:
            raise DatumError(i, "target_tokens", "is missing")
        if fields["target_tokens"].dtype != "int64":
            raise DatumError(i, "target_tokens", f"must be int64, got {fields['target_tokens'].dtype}")
        target = _as_array(i, "target_tokens", fields["target_tokens"]).astype(np.int64)
        if target.ndim == 2 and not allows_topk:
            raise DatumError(i, "target_tokens", f"loss {name} takes shape [T], got {list(target.shape)}")
        if target.ndim not in (1, 2) or target.shape[0] != n or 0 in target.shape:
            raise DatumError(
                i,
                "target_tokens",
                f"has shape {list(target.shape)}; expected [{n}] or [{n}, K] like model_input",
            )
        _check_ids(i, "target_tokens", target, vocab_size)
        arrays: dict[str, npt.NDArray[np.float32]] = {}
        for key in (*required, *optional):
            if key not in fields:
                if key in optional:
                    continue
                raise DatumError(i, key, f"is missing (loss {name} needs {', '.join(required)})")
            array = _as_array(i, key, fields[key])
            if array.shape != target.shape:
                raise DatumError(
                    i, key, f"has shape {list(array.shape)} but target_tokens has {list(target.shape)}"
                )
            if not np.isfinite(array).all():
                raise DatumError(i, key, "contains NaN or infinity")
            if loss is not None and key in loss.nonzero and not array.any():
                raise DatumError(i, key, f"is all zero: loss {name} needs it to mark at least one token")
            arrays[key] = array.astype(np.float32)
        checked.append(CheckedDatum(tokens, target, arrays))
    return checked


def pad_batch(
    checked: Sequence[CheckedDatum],
    loss: BuiltinLoss | None,
    config: Mapping[str, float],
    *,
    device: torch.device,
) -> Batch:
    """Pad checked datums (all of a request, or one micro-batch of it) into one :class:`Batch`."""
    required = loss.required if loss is not None else ()
    optional = loss.per_token_config if loss is not None else ()
    B = len(checked)
    L = max(len(d.tokens) for d in checked)
    K = max(1 if d.target.ndim == 1 else d.target.shape[1] for d in checked)
    input_ids = np.zeros((B, L), dtype=np.int64)
    attention = np.zeros((B, L), dtype=np.int64)
    targets = np.zeros((B, L, K), dtype=np.int64)
    mask = np.zeros((B, L, K), dtype=np.float32)
    inputs = {key: np.zeros((B, L, K), dtype=np.float32) for key in (*required, *optional)}
    for key in optional:
        inputs[key][:] = config[key]
    for b, datum in enumerate(checked):
        n = len(datum.tokens)
        k = 1 if datum.target.ndim == 1 else datum.target.shape[1]
        input_ids[b, :n] = datum.tokens
        attention[b, :n] = 1
        targets[b, :n, :k] = datum.target.reshape(n, k)
        mask[b, :n, :k] = 1.0
        for key, array in datum.inputs.items():
            inputs[key][b, :n, :k] = array.reshape(n, k)
    padded = bool((attention == 0).any())
    gradient = None
    if loss is not None and loss.gradient_from:
        gradient = np.stack([inputs[key] != 0 for key in loss.gradient_from]).any(axis=(0, 3))
    return Batch(
        input_ids=torch.from_numpy(input_ids).to(device),
        attention_mask=torch.from_numpy(attention).to(device) if padded else None,
        targets=torch.from_numpy(targets).to(device),
        mask=torch.from_numpy(mask).to(device),
        inputs={key: torch.from_numpy(value).to(device) for key, value in inputs.items()},
        target_shapes=[tuple(d.target.shape) for d in checked],
        num_tokens=int(attention.sum()),
        gradient=torch.from_numpy(gradient).to(device) if gradient is not None else None,
    )


def build_batch(
    data: Sequence[tinker.Datum],
    loss: BuiltinLoss | None,
    config: Mapping[str, float],
    *,
    vocab_size: int,
    max_length: int,
    device: torch.device,
) -> Batch:
    """:func:`check_data`, then :func:`pad_batch` of the whole request."""
    checked = check_data(data, loss, vocab_size=vocab_size, max_length=max_length)
    return pad_batch(checked, loss, config, device=device)


def _check_ids(index: int, key: str, ids: npt.NDArray[np.int64], vocab_size: int) -> None:
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = high if high >= vocab_size else low
        raise DatumError(index, key, f"token id {bad} is outside the vocabulary [0, {vocab_size})")
