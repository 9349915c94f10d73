"""The KL penalty against a reference model: its logprobs, folded into the RL advantages.

Re-exported by :mod:`tempering.rl.data`, the RL data path these functions belong to.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import tinker
from tinker.types import TensorData

from tempering import _core
from tempering.arrays import Float32Array, Float64Array
from tempering_protocols import FloatArray, SamplingClient

__all__ = ["incorporate_kl_penalty", "reference_logprobs"]

DataError = _core.DataError


def incorporate_kl_penalty(
    data_D: Sequence[tinker.Datum],
    ref_logprobs_D: Sequence[FloatArray],
    *,
    coef: float,
    discount: float = 0.0,
) -> tuple[list[tinker.Datum], dict[str, float]]:
    """New datums whose advantages carry a KL penalty against a reference model.

    ``ref_logprobs_D[d]`` is the reference model's logprob of each target of datum ``d`` (``T``
    values; see :func:`reference_logprobs`). With ``r_t = mask_t * (logprobs_t - ref_t)`` and
    ``r̄`` its mean over the trained positions of the whole batch, each advantage gains
    ``coef * mask_t * (r̄ - r_t)`` (its discounted future sum within the datum when
    ``discount > 0``). The given datums are not modified; the new ones share every other input.
    Metrics: ``kl/policy_base`` = ``r̄``, an estimate of KL(sampler ‖ reference).

    Example::

        ref_D = await reference_logprobs(data_D, base_sampling_client)
        data_D, kl_metrics = incorporate_kl_penalty(data_D, ref_D, coef=0.05)
    """
    if len(ref_logprobs_D) != len(data_D):
        raise DataError(f"{len(data_D)} datums but {len(ref_logprobs_D)} reference logprob arrays")
    lens = [_loss_input(d, "logprobs", i).shape[0] for i, d in enumerate(data_D)]
    offsets_D1 = np.zeros(len(data_D) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets_D1[1:])

    def flat(key: str) -> Float32Array:
        if not data_D:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(
            [_loss_input(d, key, i).astype(np.float32, copy=False) for i, d in enumerate(data_D)]
        )

    ref_N: FloatArray = (
        np.concatenate([np.asarray(r, dtype=np.float64) for r in ref_logprobs_D])
        if ref_logprobs_D
        else np.zeros(0, dtype=np.float64)
    )
    for i, (r, n) in enumerate(zip(ref_logprobs_D, lens, strict=True)):
        if len(r) != n:
            raise DataError(f"datum {i}: {n} targets but {len(r)} reference logprobs")
    adv_N, mean_diff = _core.kl_penalty(
        flat("logprobs"), ref_N, flat("mask"), flat("advantages"), offsets_D1, coef=coef, discount=discount
    )
    offs: list[int] = offsets_D1.tolist()
    new_D = [
        dataclasses.replace(
            d,
            loss_fn_inputs={
                **d.loss_fn_inputs,
                "advantages": TensorData.from_numpy(adv_N[offs[i] : offs[i + 1]]),
            },
        )
        for i, d in enumerate(data_D)
    ]
    return new_D, {"kl/policy_base": mean_diff}


def _loss_input(datum: tinker.Datum, key: str, i: int) -> npt.NDArray[np.generic]:
    td = datum.loss_fn_inputs.get(key)
    if td is None:
        raise DataError(f"datum {i}: loss_fn_inputs has no {key!r}")
    return td.to_numpy()


async def reference_logprobs(data_D: Sequence[tinker.Datum], reference: SamplingClient) -> list[Float64Array]:
    """The reference model's logprob of every target of every datum (requests run concurrently).

    Each datum's full sequence (model input + its last target) is scored; the first position has
    no logprob, the rest align with the targets. Unscored positions are NaN.
    """

    async def one(d: tinker.Datum) -> Float64Array:
        targets = d.loss_fn_inputs["target_tokens"].to_numpy()
        full = d.model_input.append_int(int(targets[-1]))
        lps = await reference.compute_logprobs(full)
        return np.array([np.nan if x is None else x for x in lps[1:]], dtype=np.float64)

    return list(await asyncio.gather(*(one(d) for d in data_D)))
