"""On-policy distillation from one teacher or several, and the KL penalty against a reference:
the per-token terms a minibatch's advantages get before training.

Shapes (docs/notation.md): ``P`` groups of a minibatch, ``D`` datums, ``N`` token positions.

Teachers: ``RLConfig.distill_teacher`` (every group) and ``RLConfig.distill_teachers`` (a logging
tag → a teacher: a group carrying the tag, e.g. an interleaved dataset's source name, is scored
by that teacher instead; one teacher per dataset). Each datum's sampled tokens are scored by its
group's teacher (``compute_logprobs``); the reverse-KL estimate ``q - p_teacher`` times
``distill_coef`` is subtracted from its advantages. A group with no teacher gets no term.
Metrics: ``distill/reverse_kl`` (over the distilled tokens) and ``distill/reverse_kl/<tag>``
per tagged teacher.

Example::

    teachers = Teachers(default=None, by_tag={"math": math_teacher, "code": code_teacher})
    batch, metrics = await apply_teachers_and_reference(batch, tags_P, teachers, None, 1.0, 0.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import numpy as np
import numpy.typing as npt

from tempering.rl.data import RaggedBatch
from tempering.rl.kl import reference_logprobs
from tempering_protocols import SamplingClient

__all__ = ["Teachers", "apply_teachers_and_reference", "flat_logprobs"]

Float32Array = npt.NDArray[np.float32]


@attrs.frozen
class Teachers:
    """The default teacher (``None``: none) and the teachers of tagged groups."""

    default: SamplingClient | None = None
    by_tag: Mapping[str, SamplingClient] = attrs.field(factory=dict[str, SamplingClient])

    @property
    def active(self) -> bool:
        return self.default is not None or bool(self.by_tag)

    def of(self, tags: Sequence[str]) -> tuple[str | None, SamplingClient | None]:
        """The teacher of a group with ``tags`` (its first tag that has one) and that tag."""
        for tag in tags:
            if tag in self.by_tag:
                return tag, self.by_tag[tag]
        return None, self.default


def flat_logprobs(per_datum: Sequence[npt.NDArray[np.float64]], batch: RaggedBatch) -> Float32Array:
    """Per-datum logprobs as one ``[N]`` array; unscored positions (NaN) agree with the sampler."""
    flat = np.concatenate(per_datum) if per_datum else np.zeros(0)
    return np.where(np.isnan(flat), batch.logprobs_N, flat).astype(np.float32)


async def apply_teachers_and_reference(
    batch: RaggedBatch,
    tags_P: Sequence[Sequence[str]],
    teachers: Teachers,
    reference: SamplingClient | None,
    distill_coef: float,
    kl_penalty_coef: float,
) -> tuple[RaggedBatch, dict[str, float]]:
    """``batch`` with the teachers' reverse-KL terms and the reference's KL penalty in its
    advantages. ``tags_P``: the logging tags of each group (``batch.group_idx_D`` indexes them).

    Example::

        batch, metrics = await apply_teachers_and_reference(batch, [["math"]], teachers, None, 1.0, 0.0)
    """
    extra: dict[str, float] = {}
    if not teachers.active and reference is None:
        return batch, extra
    data_D = batch.to_datums()
    if teachers.active:
        chosen = [teachers.of(tags_P[int(p)] if int(p) < len(tags_P) else ()) for p in batch.group_idx_D]
        clients = {id(c): c for _, c in chosen if c is not None}
        scored: dict[int, list[npt.NDArray[np.float64]]] = {}
        for key, client in clients.items():
            ds = [d for d, (_, c) in zip(data_D, chosen, strict=True) if c is not None and id(c) == key]
            scored[key] = await reference_logprobs(ds, client)
        iters = {key: iter(v) for key, v in scored.items()}
        per_datum: list[npt.NDArray[np.float64]] = []
        for d, (_, c) in enumerate(chosen):
            n = int(batch.offsets_D1[d + 1] - batch.offsets_D1[d])
            per_datum.append(next(iters[id(c)]) if c is not None else np.full(n, np.nan))
        teacher_N = flat_logprobs(per_datum, batch)
        reverse_kl_N = (batch.logprobs_N - teacher_N) * batch.mask_N
        batch = batch.with_advantages((batch.advantages_N - distill_coef * reverse_kl_N).astype(np.float32))
        distilled_N = np.zeros_like(batch.mask_N, dtype=bool)
        by_tag: dict[str, npt.NDArray[np.bool_]] = {}
        for d, (tag, c) in enumerate(chosen):
            sl = slice(int(batch.offsets_D1[d]), int(batch.offsets_D1[d + 1]))
            if c is not None:
                distilled_N[sl] = batch.mask_N[sl] > 0
            if tag is not None:
                by_tag.setdefault(tag, np.zeros_like(distilled_N))[sl] = batch.mask_N[sl] > 0
        n = int(distilled_N.sum())
        extra["distill/reverse_kl"] = float(reverse_kl_N[distilled_N].sum() / n) if n else 0.0
        for tag, on in by_tag.items():
            extra[f"distill/reverse_kl/{tag}"] = float(reverse_kl_N[on].mean()) if on.any() else 0.0
    if reference is not None:
        ref_N = flat_logprobs(await reference_logprobs(data_D, reference), batch)
        batch, kl_metrics = batch.with_kl_penalty(ref_N, coef=kl_penalty_coef)
        extra.update(kl_metrics)
    return batch, extra
