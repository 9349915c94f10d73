"""Truncated importance-sampling correction (TIS / MIS) with an off-policy sequence mask.
``RLConfig.importance``.

Shapes (docs/notation.md): ``D`` datums, ``N`` token positions of a minibatch.

The sampler that drew a step's tokens is not the trainer: its numerics differ, and under the
``async`` schedule its weights are older. Before training, one ``forward`` pass gives the
trainer's logprob ``p`` of every sampled token; with the sampler's ``q``, the per-token ratio is
``rho = exp(p - q)``. Then:

=========  ======================================================================================
mode       per-token weight ``w`` on the advantage
=========  ======================================================================================
``off``    none (default; no extra pass): the loss's own ratio against ``q``, as before
``tis``    ``min(rho, cap)``: truncated importance sampling
``mis``    ``rho`` where ``rho <= cap``, else 0 (the token is masked): masked importance sampling
=========  ======================================================================================

With ``tis`` / ``mis`` the loss's ``logprobs`` input becomes ``p`` (so its own ratio starts at 1
and the correction is ``w`` alone). ``sequence_mask=x``: a datum whose mean log-ratio over its
trained tokens is outside ``[-log x, log x]`` is masked whole (an off-policy sequence: too far
from the trainer to correct). Diagnostics, logged every step the correction runs:
``is/ratio_mean``, ``is/ratio_max``, ``is/frac_truncated`` (tokens with ``rho > cap``),
``is/frac_masked_sequences``; ``kl/sample_train_v1|v2`` are logged every step in any case, from
the sampler's logprobs (the loop keeps them aside before the correction replaces them).

Example::

    RLConfig(..., importance=ImportanceCorrection(mode="tis", cap=2.0, sequence_mask=4.0))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, TypeAlias

import attrs
import numpy as np
import numpy.typing as npt

from tempering.arrays import Float32Array
from tempering.rl.data import RaggedBatch, strip_loss_inputs
from tempering_protocols import TrainingClient

__all__ = ["ImportanceCorrection", "correct_importance", "importance_weights"]

Mode: TypeAlias = Literal["off", "tis", "mis"]


@attrs.frozen
class ImportanceCorrection:
    """Which correction, its cap and the sequence mask (see the module docstring).

    Example::

        ImportanceCorrection(mode="mis", cap=3.0)
    """

    mode: Mode = "off"
    """``off`` (no extra pass), ``tis`` (truncate the ratio at ``cap``) or ``mis`` (zero it above)."""
    cap: float = 2.0
    """``C``: the ratio above which a token's weight is truncated (``tis``) or zeroed (``mis``)."""
    sequence_mask: float | None = None
    """``x > 1``: mask a datum whose mean log-ratio is beyond ``log x`` either way; ``None``: off."""

    def __attrs_post_init__(self) -> None:
        if self.mode not in ("off", "tis", "mis"):
            raise ValueError(f"ImportanceCorrection.mode must be 'off', 'tis' or 'mis', got {self.mode!r}")
        if not (math.isfinite(self.cap) and self.cap >= 1.0):
            raise ValueError(f"ImportanceCorrection.cap must be a finite number >= 1, got {self.cap}")
        x = self.sequence_mask
        if x is not None and not (math.isfinite(x) and x > 1.0):
            raise ValueError(
                f"ImportanceCorrection.sequence_mask must be a finite number > 1 (or None), got {x}"
            )


def importance_weights(
    trainer_N: Float32Array,
    sampler_N: Float32Array,
    mask_N: Float32Array,
    offsets_D1: Sequence[int] | npt.NDArray[np.int64],
    correction: ImportanceCorrection,
) -> tuple[Float32Array, Float32Array, dict[str, float]]:
    """Per-token weights ``w_N`` and the new mask ``mask_N`` (sequences masked), with diagnostics.

    Example::

        w_N, mask_N, metrics = importance_weights(p_N, q_N, mask_N, offsets_D1, ImportanceCorrection("tis"))
    """
    on_N = mask_N > 0
    log_rho_N = np.where(on_N, trainer_N.astype(np.float64) - sampler_N.astype(np.float64), 0.0)
    rho_N = np.exp(log_rho_N)
    over_N = on_N & (rho_N > correction.cap)
    # tis: truncate at the cap; mis: zero the tokens above it.
    w_N = np.minimum(rho_N, correction.cap) if correction.mode == "tis" else np.where(over_N, 0.0, rho_N)
    new_mask_N = mask_N.copy()
    n_masked = 0
    if correction.sequence_mask is not None:
        bound = math.log(correction.sequence_mask)
        for d in range(len(offsets_D1) - 1):
            sl = slice(int(offsets_D1[d]), int(offsets_D1[d + 1]))
            on = on_N[sl]
            if on.any() and abs(float(log_rho_N[sl][on].mean())) > bound:
                new_mask_N[sl] = 0.0
                n_masked += 1
    n_on = int(on_N.sum())
    n_d = max(1, len(offsets_D1) - 1)
    metrics = {
        "is/ratio_mean": float(rho_N[on_N].mean()) if n_on else 1.0,
        "is/ratio_max": float(rho_N[on_N].max()) if n_on else 1.0,
        "is/frac_truncated": float(over_N.sum()) / n_on if n_on else 0.0,
        "is/frac_masked_sequences": n_masked / n_d,
    }
    w_N = np.where(new_mask_N > 0, w_N, 0.0).astype(np.float32)
    return w_N, new_mask_N, metrics


async def correct_importance(
    batch: RaggedBatch, client: TrainingClient, correction: ImportanceCorrection
) -> tuple[RaggedBatch, dict[str, float]]:
    """``batch`` with the correction applied (one ``forward`` pass for the trainer's logprobs);
    unchanged, with no metrics, when the mode is ``off``.

    Example::

        batch, metrics = await correct_importance(batch, training_client, correction)
    """
    if correction.mode == "off" or batch.n_datums == 0:
        return batch, {}
    out = await client.forward(
        strip_loss_inputs(batch.to_datums(), "importance_sampling"), "importance_sampling"
    )
    parts = [o["logprobs"].to_numpy().astype(np.float32, copy=False) for o in out.loss_fn_outputs]
    trainer_N = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    if trainer_N.shape != batch.logprobs_N.shape:
        raise RuntimeError(
            f"the trainer's forward returned {trainer_N.shape[0]} logprobs "
            f"for {batch.logprobs_N.shape[0]} positions"
        )
    w_N, mask_N, metrics = importance_weights(
        trainer_N, batch.logprobs_N, batch.mask_N, batch.offsets_D1, correction
    )
    logprobs_N = np.where(batch.mask_N > 0, trainer_N, batch.logprobs_N).astype(np.float32)
    adv_N = (batch.advantages_N * w_N).astype(np.float32)
    return attrs.evolve(batch, logprobs_N=logprobs_N, advantages_N=adv_N, mask_N=mask_N), metrics
