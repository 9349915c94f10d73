"""Answer-graded math benchmarks: what each one is, where its data comes from, how it is asked.

A :class:`Benchmark` names a hub dataset (its config, split and fields) and the instruction that
turns a problem into a prompt; :data:`BENCHMARKS` holds the known ones (``gsm8k``, ``math500``,
``aime24``, ``aime25``). :func:`load_items` reads a benchmark's items from the hub (Hugging Face
``datasets.load_dataset``, the ``data`` extra) or, with ``data=``, from a local file or
directory in the same schema (``tempering-assets:`` names a shipped file), so a benchmark runs
offline on a copy of its data.

Schemas: ``gsm8k`` rows have ``question`` and ``answer`` (a worked solution ending in
``#### 42``); ``math500`` rows ``problem``, ``solution`` and ``answer``; ``aime24`` / ``aime25``
rows ``problem`` and ``answer``.

Example::

    bench = get_benchmark("gsm8k")
    items = load_items(bench, data="gsm8k_test.jsonl", limit=50)
    items[0].prompt, items[0].answer     # ('Natalia sold clips ...', '72')
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from tempering.assets import resolve_data_path
from tempering.data import RowError, parse_rows
from tempering.data.hub import hub_rows

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "BenchmarkItem",
    "UnknownBenchmarkError",
    "get_benchmark",
    "load_items",
]

BOXED_INSTRUCTION = "Reason step by step, and put your final answer within \\boxed{}."
"""Appended to every problem (the usual instruction of answer-graded math benchmarks)."""


@attrs.frozen
class BenchmarkItem:
    """One problem: its id (the row's ``id`` field, else its index), the problem text and the
    reference answer (a final answer, not a worked solution)."""

    id: str
    prompt: str
    answer: str


@attrs.frozen(kw_only=True)
class Benchmark:
    """An answer-graded benchmark: hub dataset ``hub_name`` (config ``hub_config``, split
    ``split``), the row fields that hold the problem and the answer, and how a prompt is made.

    ``answer_after_hashes``: the answer field is a worked solution whose final answer follows
    ``####`` (GSM8K). ``instruction`` is appended to the problem after a blank line.
    """

    name: str
    description: str
    hub_name: str
    hub_config: str | None = None
    split: str = "test"
    problem_field: str = "problem"
    answer_field: str = "answer"
    answer_after_hashes: bool = False
    instruction: str = BOXED_INSTRUCTION

    def item(self, row: object, index: int) -> BenchmarkItem:
        """The item of one dataset row; :class:`~tempering.data.RowError` names a missing or
        non-text field."""
        if not isinstance(row, Mapping):
            raise RowError(f"{self.name}: a row must be an object, got {type(row).__name__}")
        fields: Mapping[str, object] = row  # pyright: ignore[reportUnknownVariableType]
        problem = _text_field(fields, self.problem_field, self.name)
        answer = _text_field(fields, self.answer_field, self.name)
        if self.answer_after_hashes:
            if "####" not in answer:
                raise RowError(f"{self.name}: field {self.answer_field!r} has no '#### <answer>' line")
            answer = answer.rsplit("####", 1)[1].strip().replace(",", "")
        ident = fields.get("id", fields.get("unique_id", index))
        return BenchmarkItem(str(ident), problem, answer)

    def prompt(self, item: BenchmarkItem) -> str:
        """The user message for ``item``: the problem, then the instruction."""
        return f"{item.prompt}\n\n{self.instruction}" if self.instruction else item.prompt


def _text_field(row: Mapping[str, object], field: str, name: str) -> str:
    if field not in row:
        raise RowError(f"{name}: missing field {field!r} (the row has {sorted(row)})")
    value = row[field]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"{name}: field {field!r} must be non-empty text, got {value!r}")
    return value


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            name="gsm8k",
            description="grade-school word problems, 1319 test items (openai/gsm8k, main, test)",
            hub_name="openai/gsm8k",
            hub_config="main",
            problem_field="question",
            answer_after_hashes=True,
        ),
        Benchmark(
            name="math500",
            description="500 competition problems from MATH (HuggingFaceH4/MATH-500, test)",
            hub_name="HuggingFaceH4/MATH-500",
        ),
        Benchmark(
            name="aime24",
            description="AIME 2024, 30 problems, integer answers (HuggingFaceH4/aime_2024, train)",
            hub_name="HuggingFaceH4/aime_2024",
            split="train",
        ),
        Benchmark(
            name="aime25",
            description="AIME 2025, 30 problems, integer answers (math-ai/aime25, test)",
            hub_name="math-ai/aime25",
        ),
    )
}
"""The known benchmarks by name."""


class UnknownBenchmarkError(ValueError):
    """A benchmark name that is not in :data:`BENCHMARKS` (the message lists the known ones)."""


def get_benchmark(name: str, known: Iterable[str] | None = None) -> Benchmark:
    """The benchmark called ``name``; :class:`UnknownBenchmarkError` lists the known names
    (``known``, default those of :data:`BENCHMARKS`)."""
    if name in BENCHMARKS:
        return BENCHMARKS[name]
    names = sorted(BENCHMARKS if known is None else known)
    raise UnknownBenchmarkError(f"unknown benchmark {name!r}; known benchmarks: {', '.join(names)}")


def _hub_rows(bench: Benchmark) -> Iterable[object]:
    """The rows of ``bench``'s hub split through :func:`tempering.data.hub.hub_rows` (not
    streamed: the whole split is downloaded and cached, as a benchmark is read again)."""
    if importlib.util.find_spec("datasets") is None:  # the `data` extra
        raise ImportError(
            f"benchmark {bench.name} reads {bench.hub_name} through Hugging Face datasets: "
            "pip install 'tempering[data]' (or pass data= a local copy)"
        )
    return hub_rows(bench.hub_name, split=bench.split, config=bench.hub_config, streaming=False)


def load_items(
    bench: Benchmark, data: str | os.PathLike[str] | None = None, limit: int | None = None
) -> list[BenchmarkItem]:
    """The items of ``bench``, in dataset order, at most ``limit`` of them.

    ``data``: a local ``.jsonl`` / ``.json`` / ``.parquet`` file in the benchmark's schema
    (``tempering-assets:NAME`` for a shipped one) instead of the hub dataset. A row without a
    needed field raises :class:`~tempering.data.DataError` naming the file, the row and the field.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"{bench.name}: limit must be at least 1, got {limit}")
    items: list[BenchmarkItem] = []
    if data is not None:
        path = resolve_data_path(os.fspath(data))
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"{bench.name}: no data file {path!r} (give a .jsonl/.json/.parquet file)"
            )
        counter = iter(range(1 << 62))
        for _, item in parse_rows(path, lambda row: bench.item(row, next(counter))):
            items.append(item)
            if limit is not None and len(items) >= limit:
                break
    else:
        for index, row in enumerate(_hub_rows(bench)):
            try:
                items.append(bench.item(row, index))
            except RowError as exc:
                raise ValueError(f"{bench.hub_name} ({bench.split}): row {index + 1}: {exc}") from exc
            if limit is not None and len(items) >= limit:
                break
    if not items:
        raise ValueError(f"{bench.name}: no items in {data if data is not None else bench.hub_name}")
    return items
