"""Multi-domain RL: several RL dataset builders interleaved by weight, one source per group.

Shapes (docs/notation.md): ``B`` batches, ``P`` groups per batch, ``S`` sources.

:class:`InterleavedRLDatasetBuilder` builds every named source, then fixes a schedule: for batch
``b`` and slot ``p``, which source the group comes from (drawn with probability proportional to
the weights from a generator seeded by ``(seed, b)``) and which of that source's groups it is (the
source's groups in a permutation seeded by ``(seed, source, cycle)``, a new permutation each time
the source is used up). Everything is a function of the seed and the batch index, so a resumed
run, which asks for batch ``b`` again, gets exactly the same groups. A group is always one
source's group (never mixed), so the group's advantages stay within one domain.

Per-source metrics: every group carries its source's name as a logging tag, so the RL loop logs
``env/<name>/reward/mean`` per source (and the trajectory files record the tag).

Example::

    builder = InterleavedRLDatasetBuilder(
        sources={"math": ArithmeticTask(group_size=8), "lower": LowercaseTask(group_size=8)},
        weights={"math": 3.0, "lower": 1.0},
        groups_per_batch=8,
        num_batches=100,
    )
    train, test = await builder()
    train.batch_sources(0)  # ["math", "lower", "math", ...]: the source of each group of batch 0
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import cast

import attrs
import numpy as np
import numpy.typing as npt

from tempering_protocols import Env, EnvGroupBuilder, Metrics, RLDataset, RLDatasetBuilder, Trajectory

__all__ = ["InterleavedRLDataset", "InterleavedRLDatasetBuilder", "InterleavingError", "SourceTaggedGroup"]


class InterleavingError(ValueError):
    """Bad interleaving input: a weight that is negative, not finite, or names no source; a source
    without a weight; all weights 0; an empty source. The message names the source."""


@attrs.frozen(eq=False)
class SourceTaggedGroup(EnvGroupBuilder):
    """A source's group builder with the source's name added to its logging tags."""

    inner: EnvGroupBuilder
    source: str

    @property
    def coordinated_envs(self) -> bool:
        return bool(getattr(self.inner, "coordinated_envs", False))

    async def make_envs(self) -> Sequence[Env]:
        return await self.inner.make_envs()

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        return await self.inner.compute_group_rewards(trajectories_G, envs_G)

    def logging_tags(self) -> list[str]:
        return [*self.inner.logging_tags(), self.source]

    async def cleanup(self) -> None:
        await self.inner.cleanup()


def _check_weights(names: Sequence[str], weights: Mapping[str, float]) -> None:
    missing = sorted(set(weights) - set(names))
    if missing:
        raise InterleavingError(
            f"interleaving weights name {', '.join(map(repr, missing))}, which is not a source; "
            f"the sources are {', '.join(map(repr, names))}"
        )
    unweighted = [n for n in names if n not in weights]
    if unweighted:
        raise InterleavingError(
            f"source(s) {', '.join(map(repr, unweighted))} have no weight; give each a weight"
        )
    for name, w in weights.items():
        value = cast("object", w)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise InterleavingError(f"the weight of source {name!r} must be a finite number >= 0, got {w!r}")
    if not any(weights[n] > 0 for n in names):
        raise InterleavingError(
            f"every interleaving weight is 0 ({dict(weights)}); give at least one source a weight > 0"
        )


class _Source:
    """One built source: its groups addressed by a flat index (batch sizes probed once)."""

    def __init__(self, name: str, dataset: RLDataset) -> None:
        self.name, self.dataset = name, dataset
        n_batches = len(dataset)
        first = len(dataset.get_batch(0)) if n_batches else 0
        if first == 0:
            raise InterleavingError(
                f"source {name!r} has no groups (its first batch is empty or it has no batch)"
            )
        last = len(dataset.get_batch(n_batches - 1)) if n_batches > 1 else first
        self.per_batch = first
        self.n_groups = (n_batches - 1) * first + last

    def group(self, flat: int) -> EnvGroupBuilder:
        return self.dataset.get_batch(flat // self.per_batch)[flat % self.per_batch]


class InterleavedRLDataset(RLDataset):
    """The sources' groups in a fixed weighted schedule (see the module docstring).

    ``batch_sources(b)`` names the source of each group of batch ``b``; ``source_counts`` is how
    many groups each source gives over the whole schedule.
    """

    def __init__(
        self,
        sources: Mapping[str, RLDataset],
        weights: Mapping[str, float],
        groups_per_batch: int,
        *,
        num_batches: int | None = None,
        seed: int = 0,
    ) -> None:
        names = list(sources)
        if not names:
            raise InterleavingError("interleaving needs at least one source")
        _check_weights(names, weights)
        if groups_per_batch < 1:
            raise InterleavingError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
        if num_batches is not None and num_batches < 1:
            raise InterleavingError(
                f"num_batches must be >= 1 (or None: until a source is used up), got {num_batches}"
            )
        self.names = names
        self.seed = seed
        self.groups_per_batch = groups_per_batch
        total = sum(weights[n] for n in names)
        self.probabilities_S = np.asarray([weights[n] / total for n in names], dtype=np.float64)
        self._sources = [
            _Source(n, sources[n]) for n, p in zip(names, self.probabilities_S, strict=True) if p > 0
        ]
        if num_batches is None:  # until the first weighted source would be used up (expected share)
            share = dict(zip(names, self.probabilities_S.tolist(), strict=True))
            num_batches = max(
                1, min(int(s.n_groups / (share[s.name] * groups_per_batch)) for s in self._sources)
            )
        self.num_batches = num_batches
        self._schedule_B_P = np.stack([self._draw(b) for b in range(num_batches)])
        # The k-th use of source s (in schedule order) is its group perm(s, k // n)[k % n].
        uses_S: dict[int, int] = {}
        self._use_B_P = np.zeros_like(self._schedule_B_P)
        for b in range(num_batches):
            for p in range(groups_per_batch):
                s = int(self._schedule_B_P[b, p])
                self._use_B_P[b, p] = uses_S.get(s, 0)
                uses_S[s] = uses_S.get(s, 0) + 1
        self.source_counts = {names[s]: uses_S.get(s, 0) for s in range(len(names))}
        self._by_name = {s.name: s for s in self._sources}

    def _draw(self, b: int) -> npt.NDArray[np.int64]:
        rng = np.random.default_rng([self.seed, 0, b])
        return rng.choice(len(self.names), size=self.groups_per_batch, p=self.probabilities_S).astype(
            np.int64
        )

    def _group_index(self, source: _Source, s: int, use: int) -> int:
        cycle, k = divmod(use, source.n_groups)
        return int(np.random.default_rng([self.seed, 1, s, cycle]).permutation(source.n_groups)[k])

    def __len__(self) -> int:
        return self.num_batches

    def batch_sources(self, index: int) -> list[str]:
        """The source of each group of batch ``index``."""
        return [self.names[int(s)] for s in self._schedule_B_P[self._check(index)]]

    def _check(self, index: int) -> int:
        if not 0 <= index < self.num_batches:
            raise IndexError(
                f"batch {index} is out of range: the interleaved dataset has {self.num_batches} batches"
            )
        return index

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        row_P = self._schedule_B_P[self._check(index)]
        out: list[EnvGroupBuilder] = []
        for p, s in enumerate(row_P):
            source = self._by_name[self.names[int(s)]]
            flat = self._group_index(source, int(s), int(self._use_B_P[index, p]))
            out.append(SourceTaggedGroup(source.group(flat), source.name))
        return out


class _ConcatenatedTests(RLDataset):
    """The sources' test datasets one after another, each group tagged with its source."""

    def __init__(self, tests: Sequence[tuple[str, RLDataset]]) -> None:
        self._index = [(name, ds, i) for name, ds in tests for i in range(len(ds))]

    def __len__(self) -> int:
        return len(self._index)

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        name, ds, i = self._index[index]
        return [SourceTaggedGroup(g, name) for g in ds.get_batch(i)]


@attrs.frozen(kw_only=True)
class InterleavedRLDatasetBuilder(RLDatasetBuilder):
    """Named RL dataset builders interleaved by weight (see the module docstring).

    ``num_batches`` ``None``: as many batches as the sources last, the first weighted source
    being used up (expected share) ending the schedule. The test dataset is the sources' test
    datasets one after another (``None`` when no source has one).

    Example::

        InterleavedRLDatasetBuilder(sources={"a": task_a, "b": task_b}, weights={"a": 1, "b": 1},
                                    groups_per_batch=4, seed=0)
    """

    sources: Mapping[str, RLDatasetBuilder]
    weights: Mapping[str, float]
    groups_per_batch: int
    num_batches: int | None = None
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        if not self.sources:
            raise InterleavingError("interleaving needs at least one source")
        _check_weights(list(self.sources), self.weights)

    async def __call__(self) -> tuple[InterleavedRLDataset, RLDataset | None]:
        names = list(self.sources)
        built = await asyncio.gather(*(self.sources[n]() for n in names))
        train = InterleavedRLDataset(
            {n: tr for n, (tr, _) in zip(names, built, strict=True)},
            self.weights,
            self.groups_per_batch,
            num_batches=self.num_batches,
            seed=self.seed,
        )
        tests = [(n, te) for n, (_, te) in zip(names, built, strict=True) if te is not None]
        return train, (_ConcatenatedTests(tests) if tests else None)
