"""The per-token shaping terms a minibatch's advantages get before training, applied one way.

Shapes (docs/notation.md): ``P`` groups of a minibatch, ``D`` datums, ``N`` token positions.

A :class:`TokenTerm` scores the minibatch and returns ``delta_N``, what it adds to each
token's advantage, and its metrics; :func:`shape_advantages` adds the run's terms, in order,
to the advantages (every term sees the same unshaped batch). :func:`open_terms` builds the
terms an :class:`~tempering.rl.RLConfig` asks for. A term whose signal needs no reward variance
(``keeps_constant_groups``) keeps constant-reward groups in training. The terms:

==================  =========================================================  =====================
term                ``delta_N``                                                metrics
==================  =========================================================  =====================
:class:`Distill`    ``-distill_coef * mask * (q - p_teacher)`` (reverse KL)    ``distill/reverse_kl``,
                                                                               ``…/<tag>``
:class:`KLPenalty`  ``kl_penalty_coef * mask * (r̄ - r)``, ``r = q - p_ref``,   ``kl/policy_base``
                    ``r̄`` its mean over the trained tokens (Rust core)          (``r̄``)
==================  =========================================================  =====================

Teachers: ``RLConfig.distill_teacher`` (every group) and ``RLConfig.distill_teachers`` (a logging
tag → a teacher: a group carrying the tag, e.g. an interleaved dataset's source name, is scored
by that teacher instead; one teacher per dataset). Each datum's sampled tokens are scored by its
group's teacher (``compute_logprobs``), all teachers' requests at once. A group with no teacher
gets no term.
``distill/reverse_kl`` is over the distilled tokens, ``distill/reverse_kl/<tag>`` per tagged
teacher. A new term is a class with ``keeps_constant_groups`` and an async ``__call__``, built
in :func:`open_terms`.

Example::

    terms = [Distill(Teachers(by_tag={"math": math_teacher}), coef=1.0), KLPenalty(base, coef=0.05)]
    batch, metrics = await shape_advantages(batch, tags_P, terms)
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeAlias

import attrs
import numpy as np
import numpy.typing as npt

from tempering.arrays import Float32Array
from tempering.backend import ServiceClient
from tempering.rl.data import RaggedBatch
from tempering.rl.kl import reference_logprobs
from tempering_protocols import SamplingClient

__all__ = [
    "Distill",
    "KLPenalty",
    "Teachers",
    "TermOutput",
    "TokenTerm",
    "flat_logprobs",
    "open_terms",
    "shape_advantages",
]


TermOutput: TypeAlias = tuple[Float32Array, dict[str, float]]
"""What a term returns: ``delta_N`` (float32, one per token position of the batch) and its metrics."""


class TokenTerm(Protocol):
    """A per-token term of the advantages: ``delta_N`` (one float32 per token position of the
    batch, 0 where nothing is trained) and its metrics.

    Example::

        delta_N, metrics = await KLPenalty(reference, coef=0.05)(batch, tags_P)
    """

    @property
    def keeps_constant_groups(self) -> bool:
        """Whether the term teaches without reward variance (constant-reward groups train)."""
        ...

    async def __call__(self, batch: RaggedBatch, tags_P: Sequence[Sequence[str]], /) -> TermOutput: ...


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


@attrs.frozen
class Distill:
    """On-policy distillation: each group's teacher's reverse KL, weighted by ``coef``."""

    teachers: Teachers
    coef: float
    keeps_constant_groups = True

    async def __call__(self, batch: RaggedBatch, tags_P: Sequence[Sequence[str]], /) -> TermOutput:
        data_D = batch.to_datums()
        chosen = [self.teachers.of(tags_P[int(p)] if int(p) < len(tags_P) else ()) for p in batch.group_idx_D]
        clients = list({id(c): c for _, c in chosen if c is not None}.values())
        # Every teacher scores its datums at once (each request of one teacher is concurrent too).
        scored = await asyncio.gather(
            *(
                reference_logprobs([d for d, (_, c) in zip(data_D, chosen, strict=True) if c is t], t)
                for t in clients
            )
        )
        iters = {id(t): iter(s) for t, s in zip(clients, scored, strict=True)}
        per_datum: list[npt.NDArray[np.float64]] = []
        for d, (_, c) in enumerate(chosen):
            n = int(batch.offsets_D1[d + 1] - batch.offsets_D1[d])
            per_datum.append(next(iters[id(c)]) if c is not None else np.full(n, np.nan))
        reverse_kl_N = (batch.logprobs_N - flat_logprobs(per_datum, batch)) * batch.mask_N
        distilled_N = np.zeros_like(batch.mask_N, dtype=bool)
        by_tag: dict[str, npt.NDArray[np.bool_]] = {}
        for d, (tag, c) in enumerate(chosen):
            sl = slice(int(batch.offsets_D1[d]), int(batch.offsets_D1[d + 1]))
            if c is not None:
                distilled_N[sl] = batch.mask_N[sl] > 0
            if tag is not None:
                by_tag.setdefault(tag, np.zeros_like(distilled_N))[sl] = batch.mask_N[sl] > 0
        n = int(distilled_N.sum())
        metrics = {"distill/reverse_kl": float(reverse_kl_N[distilled_N].sum() / n) if n else 0.0}
        for tag, on in by_tag.items():
            metrics[f"distill/reverse_kl/{tag}"] = float(reverse_kl_N[on].mean()) if on.any() else 0.0
        return (-(self.coef * reverse_kl_N)).astype(np.float32), metrics


@attrs.frozen
class KLPenalty:
    """The centred KL penalty against a reference policy (the Rust core's ``kl_penalty``)."""

    reference: SamplingClient
    coef: float
    keeps_constant_groups = False

    async def __call__(self, batch: RaggedBatch, tags_P: Sequence[Sequence[str]], /) -> TermOutput:
        del tags_P
        ref_N = flat_logprobs(await reference_logprobs(batch.to_datums(), self.reference), batch)
        alone = batch.with_advantages(np.zeros_like(batch.advantages_N))
        penalised, metrics = alone.with_kl_penalty(ref_N, coef=self.coef)
        return penalised.advantages_N, metrics


async def shape_advantages(
    batch: RaggedBatch, tags_P: Sequence[Sequence[str]], terms: Sequence[TokenTerm]
) -> tuple[RaggedBatch, dict[str, float]]:
    """``batch`` with every term's ``delta_N`` added to its advantages, in order, and the terms'
    metrics. ``tags_P``: the logging tags of each group (``batch.group_idx_D`` indexes them).

    Example::

        batch, metrics = await shape_advantages(batch, [["math"]], [Distill(teachers, coef=1.0)])
    """
    metrics: dict[str, float] = {}
    if not terms:
        return batch, metrics
    advantages_N = batch.advantages_N
    for term in terms:
        delta_N, term_metrics = await term(batch, tags_P)
        advantages_N = advantages_N + delta_N
        metrics.update(term_metrics)
    return batch.with_advantages(advantages_N.astype(np.float32, copy=False)), metrics


async def open_terms(
    service: ServiceClient,
    *,
    base_model: str,
    kl_penalty_coef: float,
    kl_reference: str | None,
    distill_teacher: str | None,
    distill_teachers: Mapping[str, str] | None,
    distill_coef: float,
) -> list[TokenTerm]:
    """The terms of a run (``RLConfig``'s fields of the same names), their clients created:
    distillation when a teacher is set, then the KL penalty when ``kl_penalty_coef > 0``
    (against ``kl_reference``'s sampler weights, or the base model)."""
    reference: SamplingClient | None = None
    if kl_penalty_coef > 0:
        reference = await service.create_sampling_client(
            model_path=kl_reference, base_model=None if kl_reference is not None else base_model
        )
    paths = {None: distill_teacher, **(distill_teachers or {})}
    clients = {tag: await service.create_sampling_client(model_path=p) for tag, p in paths.items() if p}
    teachers = Teachers(clients.pop(None, None), {str(t): c for t, c in clients.items()})
    terms: list[TokenTerm] = []
    if teachers.active:
        terms.append(Distill(teachers, distill_coef))
    if reference is not None:
        terms.append(KLPenalty(reference, kl_penalty_coef))
    return terms
