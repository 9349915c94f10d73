"""Interleaved RL datasets: weights, one source per group, a deterministic schedule that a fresh
build repeats (exact resume), per-source tags, and bad weights refused by name."""

from __future__ import annotations

import asyncio
import pickle
from collections import Counter
from collections.abc import Sequence

import attrs
import pytest

from tempering.rl.interleaved import (
    InterleavedRLDataset,
    InterleavedRLDatasetBuilder,
    InterleavingError,
    SourceTaggedGroup,
)
from tempering.rl.metrics import rollout_metrics
from tempering.rl.rollouts import RolloutConfig, rollout_group
from tempering_protocols import Env, EnvGroupBuilder, RLDataset


@attrs.frozen(eq=False)
class Labelled(EnvGroupBuilder):
    source: str
    index: int

    async def make_envs(self) -> Sequence[Env]:
        raise NotImplementedError  # the schedule tests never play it

    def logging_tags(self) -> list[str]:
        return ["own"]


@attrs.frozen
class Listed(RLDataset):
    """``n`` groups of source ``name``, ``per_batch`` a batch (the last may be shorter)."""

    name: str
    n: int
    per_batch: int = 3

    def __len__(self) -> int:
        return -(-self.n // self.per_batch)

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        start = index * self.per_batch
        return [Labelled(self.name, i) for i in range(start, min(self.n, start + self.per_batch))]


@attrs.frozen
class ListedBuilder:
    name: str
    n: int
    test: bool = False

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return Listed(self.name, self.n), (Listed(self.name + "-test", 2) if self.test else None)


def _keys(ds: InterleavedRLDataset, b: int) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for g in ds.get_batch(b):
        assert isinstance(g, SourceTaggedGroup)
        inner = g.inner
        assert isinstance(inner, Labelled)
        assert inner.source == g.source  # a group is one source's group, never mixed
        out.append((inner.source, inner.index))
    return out


def _dataset(seed: int = 0, num_batches: int | None = 40) -> InterleavedRLDataset:
    return InterleavedRLDataset(
        {"a": Listed("a", 10), "b": Listed("b", 7), "c": Listed("c", 5)},
        {"a": 3.0, "b": 1.0, "c": 0.0},
        groups_per_batch=8,
        num_batches=num_batches,
        seed=seed,
    )


def test_weights_set_the_share_and_a_zero_weight_source_is_never_drawn() -> None:
    ds = _dataset()
    counts = Counter(s for b in range(len(ds)) for s in ds.batch_sources(b))
    assert counts["c"] == 0
    assert counts["a"] + counts["b"] == 40 * 8
    assert 0.70 < counts["a"] / (40 * 8) < 0.80  # 3:1
    assert ds.source_counts == {"a": counts["a"], "b": counts["b"], "c": 0}


def test_each_source_cycles_through_all_its_groups_before_repeating() -> None:
    ds = _dataset()
    seen_a = [i for b in range(len(ds)) for s, i in _keys(ds, b) if s == "a"]
    for start in range(0, len(seen_a) - 10, 10):
        assert sorted(seen_a[start : start + 10]) == list(range(10))
    assert seen_a[:10] != seen_a[10:20]  # a new permutation each cycle


def test_the_schedule_is_a_function_of_seed_and_batch_index() -> None:
    first, again = _dataset(), _dataset()
    # A resumed run asks for batch 17 first: it gets exactly what the first run got.
    assert _keys(again, 17) == _keys(first, 17)
    assert [_keys(again, b) for b in range(len(again))] == [_keys(first, b) for b in range(len(first))]
    assert [_keys(_dataset(seed=1), b) for b in range(5)] != [_keys(first, b) for b in range(5)]


def test_the_default_length_ends_when_a_source_would_be_used_up() -> None:
    ds = InterleavedRLDataset({"a": Listed("a", 30), "b": Listed("b", 7)}, {"a": 3.0, "b": 1.0}, 8)
    # "a" lasts 30 / 6 = 5 batches, "b" 7 groups at an expected 2 a batch (1/4 of 8): 3 batches.
    assert len(ds) == 3
    with pytest.raises(IndexError, match="batch 3 is out of range: the interleaved dataset has 3 batches"):
        ds.get_batch(3)


def test_the_builder_builds_tags_and_pickles() -> None:
    builder = InterleavedRLDatasetBuilder(
        sources={"a": ListedBuilder("a", 6, test=True), "b": ListedBuilder("b", 6)},
        weights={"a": 1.0, "b": 1.0},
        groups_per_batch=4,
        num_batches=5,
        seed=3,
    )
    pickle.loads(pickle.dumps(builder))
    train, test = asyncio.run(builder())
    assert len(train) == 5
    assert all(g.logging_tags()[-1] in ("a", "b") for g in train.get_batch(0))
    assert train.get_batch(0)[0].logging_tags()[0] == "own"  # the source's own tags are kept
    assert test is not None
    assert [g.logging_tags()[-1] for g in test.get_batch(0)] == ["a", "a"]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"a": -1.0, "b": 1.0}, r"the weight of source 'a' must be a finite number >= 0, got -1.0"),
        ({"a": 0.0, "b": 0}, r"every interleaving weight is 0"),
        ({"a": 1.0, "b": 1.0, "z": 1.0}, r"weights name 'z', which is not a source"),
        ({"a": 1.0}, r"source\(s\) 'b' have no weight"),
        ({"a": float("nan"), "b": 1.0}, r"the weight of source 'a'"),
    ],
)
def test_bad_weights_are_refused_by_name(weights: dict[str, float], message: str) -> None:
    sources = {"a": ListedBuilder("a", 4), "b": ListedBuilder("b", 4)}
    with pytest.raises(InterleavingError, match=message):
        InterleavedRLDatasetBuilder(sources=sources, weights=weights, groups_per_batch=2)  # pyright: ignore[reportArgumentType]
    with pytest.raises(InterleavingError, match=message):
        InterleavedRLDataset({"a": Listed("a", 4), "b": Listed("b", 4)}, weights, 2)


def test_an_empty_source_is_refused_by_name() -> None:
    with pytest.raises(InterleavingError, match="source 'b' has no groups"):
        InterleavedRLDataset({"a": Listed("a", 4), "b": Listed("b", 0)}, {"a": 1.0, "b": 1.0}, 2)


def test_per_source_metrics_come_from_the_tag() -> None:
    from test_rollout_policy import Group, Policy  # a tiny group of scripted envs

    rollouts = [
        asyncio.run(rollout_group(SourceTaggedGroup(Group([{"turns": t}]), name), Policy(), RolloutConfig()))
        for name, t in (("math", 1), ("chat", 3))
    ]
    metrics = rollout_metrics(rollouts)
    assert metrics["env/math/reward/mean"] == 1.0
    assert metrics["env/chat/reward/mean"] == 3.0
