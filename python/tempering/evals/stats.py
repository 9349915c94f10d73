"""Small statistics of an evaluation: per-item seeds, a binomial confidence interval, a spread.

Example::

    item_seed(0, "gsm8k", 12, 3)        # the seed of sample 3 of item 12
    wilson_interval(37, 50)              # (0.603..., 0.841...)
    sample_std([[1, 0], [1, 1], [0, 0]]) # std over samples of the per-sample mean accuracy
    Spread((0, 1, 2), (0.41, 0.45, 0.43)).sd  # 0.02: one accuracy over three evaluation seeds
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["Spread", "item_seed", "sample_std", "wilson_interval"]


def item_seed(*key: int | str) -> int:
    """A 63-bit sampling seed, a hash of ``key`` (e.g. evaluator seed, benchmark, item index,
    sample index): stable across processes and platforms, unrelated for different keys, so
    every item and every sample of it draws its own random stream."""
    text = "/".join(f"{type(k).__name__}:{k}" for k in key)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def wilson_interval(successes: float, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% for ``z=1.96``); ``(0, 1)``
    with no trials. Samples of one item are treated as independent trials, so with several
    samples per item the interval is a little narrow; :func:`sample_std` is the other spread."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def sample_std(correct_IS: Sequence[Sequence[float]]) -> float:
    """The standard deviation (ddof 1) over sample indices ``s`` of the mean over items of
    ``correct_IS[i][s]``: how much the accuracy of one full pass varies between passes; 0 with
    fewer than two samples per item."""
    if not correct_IS:
        return 0.0
    n_samples = min(len(row) for row in correct_IS)
    if n_samples < 2:
        return 0.0
    means = [sum(row[s] for row in correct_IS) / len(correct_IS) for s in range(n_samples)]
    mu = sum(means) / n_samples
    return math.sqrt(sum((m - mu) ** 2 for m in means) / (n_samples - 1))


@attrs.frozen
class Spread:
    """One accuracy over several evaluation seeds: the values, their mean and their sample
    standard deviation (0 for one value)."""

    seeds: tuple[int, ...]
    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"seeds": list(self.seeds), "values": list(self.values), "mean": self.mean, "sd": self.sd}
