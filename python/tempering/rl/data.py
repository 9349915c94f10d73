"""The RL data path: trajectory groups → advantages → datums, on the Rust core.

Shapes (docs/notation.md): ``P`` problems (env groups), ``G`` members of a group, ``T`` token
positions of one datum, ``D`` datums, ``N`` all positions of a batch, ``C`` opaque chunks.

=============================  =============================================================
function                       what
=============================  =============================================================
:func:`compute_advantages`     total rewards → one advantage array per group (mean or RLOO
                               baseline, optional std normalisation)
:func:`remove_constant_reward_groups`  drop groups whose rewards are all equal; count them
:func:`trajectories_to_batch`  trajectories → the columnar :class:`RaggedBatch`
:func:`trajectories_to_datums` trajectories → ``list[tinker.Datum]`` + metadata
:func:`incorporate_kl_penalty` a centred KL penalty folded into the advantages (new datums)
:func:`strip_loss_inputs`      keep only the ``loss_fn_inputs`` a loss takes (drops ``mask``)
=============================  =============================================================

Packing semantics (the Tinker Cookbook's): a trajectory's transitions accumulate into one
sequence while each observation extends the sequence so far (earlier observations and actions
are its prefix, position by position); otherwise the sequence so far becomes a datum and a new
one starts. A sequence of ``L`` positions becomes a datum of ``T = L - 1``:

==================  ======  ====================  ======================  ====================
key                 shape   observation position  action position         masked turn's action
==================  ======  ====================  ======================  ====================
``model_input``     ``[T]`` the sequence without its last position
``target_tokens``   ``[T]`` the token at ``t + 1`` (0 inside an image)
``logprobs``        ``[T]`` 0                     sampler's logprob       sampler's logprob
``advantages``      ``[T]`` 0                     trajectory's advantage  0
``mask``            ``[T]`` 0                     1                       0
==================  ======  ====================  ======================  ====================

Non-token chunks (images) count by their ``.length``, are carried unchanged into the datum's
model input, and match in the prefix test only an equal chunk (same type and field values) at
the same position. ``mask`` is for client-side use: :func:`strip_loss_inputs` removes it before
data is sent to a loss.

Example::

    advantages_P = compute_advantages(groups_P)
    data_D, metadata_D = trajectories_to_datums(groups_P, advantages_P)
    fut = training_client.forward_backward(strip_loss_inputs(data_D, "importance_sampling"),
                                           "importance_sampling")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal, TypeAlias

import attrs
import numpy as np
import numpy.typing as npt
import tinker
from tinker.types import LossFnType, ModelInputChunk
from typing_extensions import TypedDict

from tempering import _core
from tempering.arrays import Float32Array, Float64Array, Int64Array
from tempering.data.datums import datum_model_input, from_packed, packed_datums
from tempering.losses import LOSSES
from tempering.rl.kl import incorporate_kl_penalty, reference_logprobs
from tempering_protocols import FloatArray, TrajectoryGroup

__all__ = [
    "Baseline",
    "DataError",
    "DatumMetadata",
    "RaggedBatch",
    "compute_advantages",
    "incorporate_kl_penalty",
    "reference_logprobs",
    "remove_constant_reward_groups",
    "strip_loss_inputs",
    "trajectories_to_batch",
    "trajectories_to_datums",
]

DataError = _core.DataError
"""Bad input (a ``ValueError``); the message names problem, member, transition and token."""

Baseline: TypeAlias = Literal["mean", "loo"]


class DatumMetadata(TypedDict):
    """Where a datum came from: problem ``group_idx``, member ``traj_idx``."""

    group_idx: int
    traj_idx: int


# ------------------------------------------------------------------------------ advantages


def compute_advantages(
    trajectory_groups_P: Sequence[TrajectoryGroup],
    *,
    normalize_std: bool = False,
    baseline: Baseline = "mean",
) -> list[Float64Array]:
    """One advantage per trajectory, as one float64 array per group (views of one buffer).

    The reward of a trajectory is its total reward (``TrajectoryGroup.get_total_rewards``: step
    rewards summed, plus the group's final reward). ``baseline="mean"`` subtracts the group mean
    (GRPO-style centering); ``"loo"`` the mean of the *other* members (RLOO; a group of one gets
    0). ``normalize_std`` divides by the group's population standard deviation (+1e-6).

    Raises ``DataError`` for an empty group or a NaN / infinite reward (naming the problem,
    member and transition). Finite rewards up to the float64 limit give finite advantages; a group
    whose advantages do not fit in a float64 is a ``DataError`` naming the problem.

    Example::

        advantages_P = compute_advantages(groups_P, baseline="loo")
    """
    rewards_PG, offsets_P1 = _core.total_rewards(trajectory_groups_P)
    if len(offsets_P1) == 1:
        return []
    adv_PG = _core.group_advantages(rewards_PG, offsets_P1, baseline=baseline, normalize_std=normalize_std)
    return np.split(adv_PG, offsets_P1[1:-1])


def remove_constant_reward_groups(
    trajectory_groups_P: Sequence[TrajectoryGroup],
) -> tuple[list[TrajectoryGroup], int]:
    """Drop the groups whose members all got the same total reward; return ``(kept, n_removed)``.

    Such groups have zero advantages: they cost compute and teach nothing. The count is returned
    so the caller logs it (e.g. as ``env/n_constant_reward_groups``) rather than losing it; when
    every group is constant the kept list is empty and the caller should skip the step.

    Example::

        groups_P, n_removed = remove_constant_reward_groups(groups_P)
        metrics["env/n_constant_reward_groups"] = n_removed
    """
    rewards_PG, offsets_P1 = _core.total_rewards(trajectory_groups_P)
    constant_P = _core.constant_groups(rewards_PG, offsets_P1)
    kept = [g for g, c in zip(trajectory_groups_P, constant_P.tolist(), strict=True) if not c]
    return kept, len(trajectory_groups_P) - len(kept)


# ------------------------------------------------------------------------------ the batch


@attrs.frozen(eq=False)
class RaggedBatch:
    """RL datums, columnar: ``D`` datums, ``N`` positions, ``C`` opaque (non-token) chunks.

    Every array is a numpy array the Rust core allocated and handed over without a copy.

    =====================  ==========  ============================================================
    field                  shape       meaning
    =====================  ==========  ============================================================
    ``tokens_N``           ``[N]``     model-input tokens (0 inside opaque chunks)
    ``target_tokens_N``    ``[N]``     the next token (0 inside opaque chunks)
    ``logprobs_N``         ``[N]``     sampler's logprob of the target (0 on observations)
    ``advantages_N``       ``[N]``     advantage of the target (0 on observations, masked turns)
    ``mask_N``             ``[N]``     1 where the target is a trained action token, else 0
    ``offsets_D1``         ``[D+1]``   datum ``d`` is positions ``[offsets_D1[d], offsets_D1[d+1])``
    ``group_idx_D``        ``[D]``     the problem (group) of each datum
    ``traj_idx_D``         ``[D]``     the member of its group of each datum
    ``opaque_offsets_D1``  ``[D+1]``   the opaque chunks of datum ``d``, over ``C``
    ``opaque_pos_C``       ``[C]``     position of each opaque chunk in its datum's model input
    ``opaque_len_C``       ``[C]``     its length in positions
    ``opaque_chunks_C``    ``C``       the chunk objects, unchanged
    ``token_runs_D``       ``D``       optional: model-input tokens as ready lists (see
                                       ``trajectories_to_batch(token_runs=True)``)
    =====================  ==========  ============================================================

    Example::

        batch = trajectories_to_batch(groups_P, advantages_P)
        d = 0
        sl = slice(batch.offsets_D1[d], batch.offsets_D1[d + 1])
        loss = -(batch.advantages_N[sl] * new_logprobs_T).sum()
    """

    tokens_N: Int64Array
    target_tokens_N: Int64Array
    logprobs_N: Float32Array
    advantages_N: Float32Array
    mask_N: Float32Array
    offsets_D1: Int64Array
    group_idx_D: Int64Array
    traj_idx_D: Int64Array
    opaque_offsets_D1: Int64Array
    opaque_pos_C: Int64Array
    opaque_len_C: Int64Array
    opaque_chunks_C: Sequence[ModelInputChunk] = ()
    token_runs_D: Sequence[Sequence[list[int]]] | None = None
    """Optional: each datum's model-input tokens as ready lists (the runs between its opaque
    chunks), used by :meth:`to_datums` instead of converting ``tokens_N``."""

    @classmethod
    def from_arrays(
        cls,
        *,
        tokens_N: Int64Array,
        target_tokens_N: Int64Array,
        logprobs_N: Float32Array,
        advantages_N: Float32Array,
        mask_N: Float32Array,
        offsets_D1: Int64Array,
        group_idx_D: Int64Array | None = None,
        traj_idx_D: Int64Array | None = None,
    ) -> RaggedBatch:
        """A batch of token-only datums from numpy buffers, checked (dtype, shape, contiguity,
        offsets), not copied. Missing ``group_idx_D`` / ``traj_idx_D`` default to 0."""
        n = len(tokens_N)
        for name, arr, dtype in [
            ("tokens_N", tokens_N, np.int64),
            ("target_tokens_N", target_tokens_N, np.int64),
            ("logprobs_N", logprobs_N, np.float32),
            ("advantages_N", advantages_N, np.float32),
            ("mask_N", mask_N, np.float32),
            ("offsets_D1", offsets_D1, np.int64),
        ]:
            _check_array(name, arr, dtype, None if name == "offsets_D1" else n)
        _core.validate_offsets(offsets_D1, n, what="offsets_D1")
        n_d = len(offsets_D1) - 1
        zeros = np.zeros(n_d, dtype=np.int64)
        group_idx_D = zeros if group_idx_D is None else group_idx_D
        traj_idx_D = zeros if traj_idx_D is None else traj_idx_D
        _check_array("group_idx_D", group_idx_D, np.int64, n_d)
        _check_array("traj_idx_D", traj_idx_D, np.int64, n_d)
        return cls(
            tokens_N=tokens_N,
            target_tokens_N=target_tokens_N,
            logprobs_N=logprobs_N,
            advantages_N=advantages_N,
            mask_N=mask_N,
            offsets_D1=offsets_D1,
            group_idx_D=group_idx_D,
            traj_idx_D=traj_idx_D,
            opaque_offsets_D1=np.zeros(n_d + 1, dtype=np.int64),
            opaque_pos_C=np.zeros(0, dtype=np.int64),
            opaque_len_C=np.zeros(0, dtype=np.int64),
        )

    @property
    def n_datums(self) -> int:
        return len(self.offsets_D1) - 1

    def metadata(self) -> list[DatumMetadata]:
        """``{"group_idx": p, "traj_idx": g}`` for each datum."""
        return [
            DatumMetadata(group_idx=p, traj_idx=g)
            for p, g in zip(self.group_idx_D.tolist(), self.traj_idx_D.tolist(), strict=True)
        ]

    def model_input(self, d: int, /) -> tinker.ModelInput:
        """The model input of datum ``d`` (token chunks and the opaque chunks, in place)."""
        return datum_model_input(self, d)

    def to_datums(self) -> list[tinker.Datum]:
        """``tinker.Datum`` objects with ``target_tokens``, ``logprobs``, ``advantages`` and
        ``mask``, each a ``TensorData`` over a view of this batch's buffers (no copies)."""
        inputs = {
            "target_tokens": self.target_tokens_N,
            "logprobs": self.logprobs_N,
            "advantages": self.advantages_N,
            "mask": self.mask_N,
        }
        return packed_datums(self, inputs, self.token_runs_D)

    def with_advantages(self, advantages_N: Float32Array, /) -> RaggedBatch:
        """The same batch with other advantages (this one is not modified)."""
        _check_array("advantages_N", advantages_N, np.float32, len(self.tokens_N))
        return attrs.evolve(self, advantages_N=advantages_N)

    def with_kl_penalty(
        self, ref_logprobs_N: FloatArray, /, *, coef: float, discount: float = 0.0
    ) -> tuple[RaggedBatch, dict[str, float]]:
        """A new batch whose advantages carry a KL penalty against ``ref_logprobs_N`` (the
        reference model's logprob of each target), and the metrics; see
        :func:`incorporate_kl_penalty`."""
        adv_N, mean_diff = _core.kl_penalty(
            self.logprobs_N,
            ref_logprobs_N,
            self.mask_N,
            self.advantages_N,
            self.offsets_D1,
            coef=coef,
            discount=discount,
        )
        return attrs.evolve(self, advantages_N=adv_N), {"kl/policy_base": mean_diff}


def _check_array(name: str, arr: npt.NDArray[np.generic], dtype: type[np.generic], n: int | None) -> None:
    if not isinstance(arr, np.ndarray):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise DataError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    if arr.dtype != dtype or arr.ndim != 1:
        raise DataError(f"{name}: expected a 1-D {np.dtype(dtype).name} array, got {arr.ndim}-D {arr.dtype}")
    if not arr.flags.c_contiguous:
        raise DataError(f"{name} must be C-contiguous; pass np.ascontiguousarray({name})")
    if n is not None and len(arr) != n:
        raise DataError(f"{name}: expected length {n}, got {len(arr)}")


# ------------------------------------------------------------------------------ packing


def trajectories_to_batch(
    trajectory_groups_P: Sequence[TrajectoryGroup],
    advantages_P: Sequence[FloatArray],
    *,
    token_runs: bool = False,
) -> RaggedBatch:
    """Trajectories → the columnar :class:`RaggedBatch` (one Rust call, GIL released).

    ``advantages_P[p]`` has one advantage per member of group ``p``. Tokens and logprobs may be
    lists or numpy arrays (int32/int64, float32/float64; borrowed, not copied). Raises
    ``DataError`` naming the problem, member, transition and token for: logprobs whose length
    differs from the action's, a NaN / infinite logprob or advantage, an empty group, group sizes
    that disagree with ``advantages_P``, wrong dtypes, non-contiguous arrays, a sequence too short
    to make a datum or ending in a non-token chunk.

    ``token_runs=True`` also keeps each datum's model-input tokens as Python lists that share the
    int objects of the input token lists (``RaggedBatch.token_runs_D``), which makes a later
    :meth:`RaggedBatch.to_datums` cheaper; ask for it when the batch will become datums.

    Example::

        batch = trajectories_to_batch(groups_P, compute_advantages(groups_P))
    """
    return from_packed(
        RaggedBatch, _core.pack_trajectories(trajectory_groups_P, advantages_P, token_runs=token_runs)
    )


def trajectories_to_datums(
    trajectory_groups_P: Sequence[TrajectoryGroup], advantages_P: Sequence[FloatArray]
) -> tuple[list[tinker.Datum], list[DatumMetadata]]:
    """Trajectories → ``(data_D, metadata_D)``: ``tinker.Datum`` objects with ``loss_fn_inputs``
    ``target_tokens``, ``logprobs``, ``advantages``, ``mask``, and where each came from.

    Same semantics and errors as :func:`trajectories_to_batch`. The model inputs' token lists
    share the int objects of the input token lists where those are lists of ints (a pointer copy
    per token rather than a new int), so the inputs must not be modified while this runs.

    Example::

        data_D, metadata_D = trajectories_to_datums(groups_P, advantages_P)
        metadata_D[0]["group_idx"], metadata_D[0]["traj_idx"]
    """
    batch = trajectories_to_batch(trajectory_groups_P, advantages_P, token_runs=True)
    return batch.to_datums(), batch.metadata()


# ------------------------------------------------------------------------------ sending


def strip_loss_inputs(data_D: Sequence[tinker.Datum], loss_fn: LossFnType) -> list[tinker.Datum]:
    """New datums holding only the ``loss_fn_inputs`` that ``loss_fn`` takes
    (:attr:`tempering.losses.LossSpec.accepted_inputs`).

    The hosted service expects only a loss's own inputs; ``mask`` (and anything else) is for
    client-side use. For ``"custom"`` losses (computed client-side) only ``mask`` is removed.
    Datums that need no change are returned as they are; none is modified.

    Example::

        training_client.forward_backward(strip_loss_inputs(data_D, "ppo"), "ppo")
    """
    spec = LOSSES.get(loss_fn)
    keep = spec.accepted_inputs if spec is not None else None
    out: list[tinker.Datum] = []
    for d in data_D:
        wanted = {
            k: v for k, v in d.loss_fn_inputs.items() if (k in keep if keep is not None else k != "mask")
        }
        out.append(
            d if len(wanted) == len(d.loss_fn_inputs) else dataclasses.replace(d, loss_fn_inputs=wanted)
        )
    return out
