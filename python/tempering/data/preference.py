"""Preference data: labeled comparisons from local files."""

from __future__ import annotations

import os

import attrs
import numpy as np

from tempering.data._parse import parse_comparison_row
from tempering.data._rows import Format
from tempering.data.batches import BatchedDataset
from tempering.data.chat import Loaded, load_rows
from tempering.data.hf_source import Columns
from tempering_protocols import LabeledComparison

__all__ = ["ComparisonDatasetBuilder", "load_comparisons"]


def load_comparisons(
    path: str | os.PathLike[str],
    *,
    format: Format | None = None,
    skip_bad_rows: bool = False,
    columns: Columns = None,
) -> Loaded[LabeledComparison]:
    """Every labeled comparison of a file, or of an ``hf:NAME[:split]`` dataset with its column
    mapping ``columns`` (:mod:`tempering.data.hf_source`), in memory.

    Rows are ``{"prompt_conversation", "completion_A", "completion_B", "label"}`` or
    ``{"prompt", "chosen", "rejected"}`` (see :func:`~tempering.data.parse_comparison_row`).

    Example::

        data = load_comparisons(tempering.assets.path("arithmetic_preferences.jsonl"))
        data.items[0].label  # "A" or "B"
    """
    return load_rows(path, parse_comparison_row, format=format, skip_bad_rows=skip_bad_rows, columns=columns)


@attrs.frozen
class ComparisonDatasetBuilder:
    """A picklable config for preference data; calling it builds (train, held-out).

    The train comparisons come in shuffled batches (:class:`BatchedDataset`, which implements
    ``ComparisonDataset``); the held-out ones are ``test_size`` comparisons drawn from ``path``
    plus every comparison in ``test_path``, in file order.

    Example::

        train, test = ComparisonDatasetBuilder(
            path=tempering.assets.path("arithmetic_preferences.jsonl"), batch_size=16, test_size=40
        )()
        train.get_batch(0)  # 16 LabeledComparison
    """

    path: str = attrs.field(converter=os.fspath)
    batch_size: int
    test_path: str | None = attrs.field(default=None, converter=attrs.converters.optional(os.fspath))
    test_size: int = 0
    seed: int = 0
    format: Format | None = None
    skip_bad_rows: bool = False
    columns: str | None = None
    """An ``hf:`` path's column mapping (``"chosen=good,rejected=bad"``), for both paths."""

    def __call__(
        self,
    ) -> tuple[BatchedDataset[LabeledComparison], BatchedDataset[LabeledComparison] | None]:
        data = load_comparisons(
            self.path, format=self.format, skip_bad_rows=self.skip_bad_rows, columns=self.columns
        )
        if not 0 <= self.test_size < len(data):
            raise ValueError(
                f"{self.path}: test_size={self.test_size} but the file has {len(data)} comparisons"
            )
        order = np.random.default_rng([self.seed, 1 << 20]).permutation(len(data))
        held = sorted(int(i) for i in order[: self.test_size])
        keep = sorted(int(i) for i in order[self.test_size :])
        test_items = [data.items[i] for i in held]
        if self.test_path is not None:
            test_items += load_comparisons(
                self.test_path, format=self.format, skip_bad_rows=self.skip_bad_rows, columns=self.columns
            ).items
        train = BatchedDataset([data.items[i] for i in keep], self.batch_size, seed=self.seed)
        test = (
            BatchedDataset(test_items, self.batch_size, shuffle=False, drop_last=False)
            if test_items
            else None
        )
        return train, test
