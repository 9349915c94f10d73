"""Hugging Face datasets by hub name or local path, through the real ``datasets.load_dataset``.

One loader serves the hub and local copies: ``source`` is a hub name (``openai/gsm8k``), a
local directory in the dataset's layout (``train.jsonl`` / ``test.parquet`` / ``data/…``, as
``load_dataset`` reads a directory), or one local file (``.jsonl``, ``.json``, ``.parquet``,
``.csv``, ``.arrow``; its rows are the requested split). Either way the rows come from
``datasets.load_dataset`` (streamed: nothing is cached on disk, and ``limit`` rows are read
from the hub without downloading the rest).

The math datasets (:data:`MATH_DATASETS`) know their hub name, config, splits and fields:

============ ============================================== ======== ========================================
name         hub name (config)                              splits   question → reference answer
============ ============================================== ======== ========================================
``gsm8k``    ``openai/gsm8k`` (``main``)                    train,   ``question`` → ``answer`` after ``####``
                                                            test
``math500``  ``HuggingFaceH4/MATH-500``                     test     ``problem`` → ``answer``
``math``     ``DigitalLearningGmbH/MATH-lighteval``         train,   ``problem`` → last ``\\boxed{}`` of
             (``default``)                                  test     ``solution``
``deepmath`` ``zwhe99/DeepMath-103K``                       train    ``question`` → ``final_answer``
``polaris``  ``POLARIS-Project/Polaris-Dataset-53K``        train    ``problem`` → ``answer``
``aime``     ``HuggingFaceH4/aime_2024``                    train    ``problem`` → ``answer``
============ ============================================== ======== ========================================

A row without a field (or with an empty one) raises :class:`~tempering.data.DataError` naming
the dataset, the row and the field.

Example::

    from tempering.data.hub import load_math_problems
    problems = load_math_problems("gsm8k", split="test", limit=100)          # from the hub
    problems = load_math_problems("gsm8k", source="fixtures/gsm8k")          # a local copy
    problems = load_math_problems("gsm8k", source="tempering-assets:word_problems_test.jsonl")
    problems[0].question, problems[0].answer   # ("Natalia sold clips to ...", "72")
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal, TypeAlias, cast

import attrs

from tempering.assets import resolve_data_path
from tempering.data._rows import DataError
from tempering.grading import extract_answer

__all__ = [
    "MATH_DATASETS",
    "AnswerStyle",
    "MathDatasetSpec",
    "MathProblem",
    "boxed_solution",
    "hub_rows",
    "is_local",
    "load_math_problems",
]

AnswerStyle: TypeAlias = Literal["plain", "gsm8k", "boxed"]
"""How a row's answer field becomes the reference answer: as it is (``plain``), the text after
the last ``####`` (``gsm8k``), or the content of the last ``\\boxed{}`` (``boxed``, a solution)."""

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


@attrs.frozen
class MathDatasetSpec:
    """Where a math dataset lives and which fields hold its question and answer.

    Example::

        MathDatasetSpec("mine", hub="me/my-math", splits=("train",), question_field="prompt",
                        answer_field="target")
    """

    name: str
    hub: str
    splits: tuple[str, ...]
    question_field: str
    answer_field: str
    answer_style: AnswerStyle = "plain"
    config: str | None = None

    @property
    def default_split(self) -> str:
        """``test`` when there is one (evaluation), else the first split."""
        return "test" if "test" in self.splits else self.splits[0]


MATH_DATASETS: Mapping[str, MathDatasetSpec] = {
    spec.name: spec
    for spec in (
        MathDatasetSpec("gsm8k", "openai/gsm8k", ("train", "test"), "question", "answer", "gsm8k", "main"),
        MathDatasetSpec("math500", "HuggingFaceH4/MATH-500", ("test",), "problem", "answer"),
        MathDatasetSpec(
            "math",
            "DigitalLearningGmbH/MATH-lighteval",
            ("train", "test"),
            "problem",
            "solution",
            "boxed",
            "default",
        ),
        MathDatasetSpec("deepmath", "zwhe99/DeepMath-103K", ("train",), "question", "final_answer"),
        MathDatasetSpec("polaris", "POLARIS-Project/Polaris-Dataset-53K", ("train",), "problem", "answer"),
        MathDatasetSpec("aime", "HuggingFaceH4/aime_2024", ("train",), "problem", "answer"),
    )
}
"""The known math datasets by short name (see the module's table)."""


@attrs.frozen
class MathProblem:
    """One question and its reference answer; ``origin`` says where it was read
    (``"gsm8k (openai/gsm8k [test]): row 3"``); ``solution`` is the worked solution the answer
    was read from (GSM8K's ``answer``, MATH's ``solution``), else None."""

    question: str
    answer: str
    origin: str
    solution: str | None = None


_CALCULATOR = re.compile(r"<<[^<>]*>>")
_FINAL_LINE = re.compile(r"\n?####\s*(.+?)\s*$")


def boxed_solution(solution: str) -> str:
    """A worked solution as a model should write it: GSM8K's calculator annotations
    (``<<3*4=12>>``) removed and its final ``#### n`` line written ``\\boxed{n}``; a solution
    that already boxes its answer is returned without the annotations.

    Example::

        boxed_solution("3 * 4 = <<3*4=12>>12\\n#### 12")   # "3 * 4 = 12\\n\\boxed{12}"
    """
    text = _CALCULATOR.sub("", solution)
    return _FINAL_LINE.sub(lambda m: "\n\\boxed{" + m[1].replace(",", "") + "}", text).strip()


def is_local(source: str | os.PathLike[str]) -> bool:
    """Whether ``source`` names a local file or directory (else it is a hub name or a
    ``load_dataset`` builder such as ``json``)."""
    return Path(resolve_data_path(os.fspath(source))).exists()


def _missing_datasets() -> ImportError:
    return ImportError(
        "reading Hugging Face datasets needs the `datasets` package: pip install 'tempering[data]'"
    )


def hub_rows(
    source: str | os.PathLike[str],
    *,
    split: str = "train",
    config: str | None = None,
    data_files: str | list[str] | None = None,
    streaming: bool = True,
) -> Iterator[dict[str, object]]:
    """The rows of one split of a dataset, through ``datasets.load_dataset``.

    ``source``: a hub name (``openai/gsm8k``, with ``config``), a local directory (read as
    ``load_dataset`` reads one), a local file (its rows are ``split``; a ``tempering-assets:``
    path names a shipped file), or a builder name (``json``, ``parquet``, ``csv``) with
    ``data_files``. ``streaming`` reads rows as they come (nothing cached on disk).

    A source that cannot be read (unknown name, no network, no such split) raises ValueError
    naming it and what to do.

    Example::

        for row in hub_rows("openai/gsm8k", config="main", split="test"):
            row["question"]
        next(hub_rows("json", data_files="rows.jsonl"))
    """
    try:
        import datasets  # optional: the `data` extra
    except ImportError as exc:
        raise _missing_datasets() from exc
    name = resolve_data_path(os.fspath(source))
    path = Path(name)
    builder, files = name, data_files
    if path.is_file():
        builder = _BUILDERS.get(path.suffix.lower(), "")
        if not builder:
            raise ValueError(
                f"{name}: cannot tell the format from the suffix; use one of {sorted(_BUILDERS)}"
            )
        files, config = {split: name}, None
    from datasets.exceptions import DatasetsError

    try:
        loaded = datasets.load_dataset(builder, config, data_files=files, split=split, streaming=streaming)
        rows = iter(loaded)
        first = next(rows, None)
    except (OSError, ValueError, DatasetsError) as exc:
        where = f"{name}" + (f" (config {config})" if config and not path.exists() else "")
        hint = (
            "check the path"
            if path.exists()
            else "check the name, or give a local copy (a directory or file in the dataset's schema); "
            "offline (HF_HUB_OFFLINE=1) only cached datasets load"
        )
        raise ValueError(
            f"dataset {where} [{split}] could not be loaded ({type(exc).__name__}: {exc}); {hint}"
        ) from exc
    if first is None:
        return
    yield cast("dict[str, object]", first)
    for row in rows:
        yield cast("dict[str, object]", row)


def _field(row: Mapping[str, object], field: str, dataset: str, number: int) -> str:
    value = row.get(field)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
        # A column missing from some rows of a file reads as None in those rows.
        fields = ", ".join(sorted(k for k, v in row.items() if v is not None)) or "none"
        reason = (
            f"no field {field!r} (a non-empty string or number); the row's fields: {fields}"
            if value is None
            else f"field {field!r} is {value!r}, not a non-empty string or number"
        )
        raise DataError(dataset, number, reason, unit="row")
    return str(value).strip()


def _reference(text: str, style: AnswerStyle, field: str, dataset: str, number: int) -> str:
    if style == "plain":
        return text
    found = extract_answer(text, style)
    if found is None or not found.strip():
        marker = "no '#### answer' line" if style == "gsm8k" else "no \\boxed{...} answer"
        raise DataError(dataset, number, f"field {field!r} has {marker}: {text[:80]!r}", unit="row")
    return found.replace(",", "") if style == "gsm8k" else found.strip()


def load_math_problems(
    dataset: str | MathDatasetSpec,
    *,
    source: str | os.PathLike[str] | None = None,
    split: str | None = None,
    config: str | None = None,
    limit: int | None = None,
) -> list[MathProblem]:
    """``load_math_problems(dataset, *, source=None, split=None, config=None, limit=None)
    -> list[MathProblem]``: the (question, reference answer) items of a math dataset.

    ``dataset``: a name in :data:`MATH_DATASETS` (``gsm8k``, ``math500``, ``math``,
    ``deepmath``, ``polaris``, ``aime``) or a :class:`MathDatasetSpec`; its schema (fields,
    answer style) applies to whatever ``source`` holds. ``source``: the hub name (default: the
    dataset's), or a local directory or file in the dataset's schema (see :func:`hub_rows`).
    ``split``: default ``test`` when the dataset has one, else its first split. ``config``:
    default the dataset's for its hub name, none for a local source. ``limit``: the first rows
    only.

    A row without the question or answer field (or a GSM8K answer without ``####``, a MATH
    solution without ``\\boxed``) raises :class:`~tempering.data.DataError` naming the
    dataset, the row (1-based) and the field.

    Example::

        load_math_problems("gsm8k", source="tempering-assets:word_problems_test.jsonl")[0]
        # MathProblem(question='Ava has 3 boxes ...', answer='24', origin='... row 1')
    """
    spec = _spec(dataset)
    chosen = split or spec.default_split
    where = os.fspath(source) if source is not None else spec.hub
    if source is None:
        config = config or spec.config
    label = f"{spec.name} ({where}) [{chosen}]" if where != spec.hub else f"{spec.name} ({where} [{chosen}])"
    out: list[MathProblem] = []
    if limit is not None and limit <= 0:
        return out
    for number, row in enumerate(hub_rows(where, split=chosen, config=config), start=1):
        question = _field(row, spec.question_field, label, number)
        raw = _field(row, spec.answer_field, label, number)
        answer = _reference(raw, spec.answer_style, spec.answer_field, label, number)
        solution = raw if spec.answer_style != "plain" else None
        out.append(MathProblem(question, answer, f"{label}: row {number}", solution))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ValueError(f"{label}: no rows")
    return out


def _spec(dataset: str | MathDatasetSpec) -> MathDatasetSpec:
    if isinstance(dataset, MathDatasetSpec):
        return dataset
    spec = MATH_DATASETS.get(dataset)
    if spec is None:
        raise ValueError(f"unknown math dataset {dataset!r}; known: {', '.join(MATH_DATASETS)}")
    return spec
