"""The row schemas of the non-math benchmarks: one function per dataset, row → :class:`BenchmarkItem`.

============== ========================================================================
benchmark      hub row fields read (others ignored)
============== ========================================================================
``mmlu_pro``   ``question``, ``options`` (up to 10), ``answer`` (a letter), ``question_id``
``gpqa``       ``Question``, ``Correct Answer``, ``Incorrect Answer 1``-``3``, ``Record ID``
               (options shuffled with a seed of the record, so every run asks the same order)
``supergpqa``  ``question``, ``options``, ``answer_letter``, ``uuid``
``mmlu_redux`` ``question``, ``choices`` (4), ``answer`` (the correct choice's index),
               ``error_type`` (rows other than ``ok`` are left out: their label is wrong)
``ifeval``     ``key``, ``prompt``, ``instruction_id_list``, ``kwargs`` (one object per id)
``mbpp``       ``task_id``, ``text`` (or ``prompt``), ``test_list``, ``test_setup_code`` (or
               ``test_imports``), ``code``
============== ========================================================================

A multiple-choice item's ``answer`` is the correct letter and ``meta["letters"]`` the valid ones;
an ifeval item's ``meta`` holds ``ids`` and the validated ``kwargs``; an mbpp item's ``meta``
holds ``tests`` and ``setup``. A missing or malformed field raises
:class:`~tempering.data.RowError` naming it (the caller adds the file and row).
"""

from __future__ import annotations

import random
import string
from collections.abc import Mapping

from tempering.data import RowError
from tempering.evals import ifeval
from tempering.evals.items import BenchmarkItem, text_field
from tempering.evals.stats import item_seed

__all__ = [
    "choice_prompt",
    "gpqa_item",
    "ifeval_item",
    "mbpp_item",
    "mmlu_pro_item",
    "mmlu_redux_item",
    "supergpqa_item",
]

LETTERS = string.ascii_uppercase


def _list_field(row: Mapping[str, object], field: str, name: str, min_len: int = 1) -> list[object]:
    if field not in row:
        raise RowError(f"{name}: missing field {field!r} (the row has {sorted(row)})")
    value = row[field]
    if not isinstance(value, list | tuple) or len(value) < min_len:  # pyright: ignore[reportUnknownArgumentType]
        raise RowError(f"{name}: field {field!r} must be a list of at least {min_len}, got {value!r}")
    return list(value)  # pyright: ignore[reportUnknownArgumentType]


def _options(row: Mapping[str, object], field: str, name: str) -> list[str]:
    options = _list_field(row, field, name, 2)
    if len(options) > len(LETTERS):
        raise RowError(f"{name}: field {field!r} has {len(options)} options, at most {len(LETTERS)}")
    out: list[str] = []
    for i, option in enumerate(options):
        if isinstance(option, int | float) and not isinstance(option, bool):
            option = str(option)
        if not isinstance(option, str) or not option.strip():
            raise RowError(f"{name}: field {field!r}: option {i} must be non-empty text, got {option!r}")
        out.append(option.strip())
    return out


def choice_prompt(question: str, options: list[str]) -> str:
    """The question, a blank line, then ``A. …`` one option a line."""
    lines = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))
    return f"{question.strip()}\n\n{lines}"


def _choice(ident: object, question: str, options: list[str], correct: int) -> BenchmarkItem:
    letters = LETTERS[: len(options)]
    return BenchmarkItem(str(ident), choice_prompt(question, options), letters[correct], {"letters": letters})


def _letter(row: Mapping[str, object], field: str, name: str, n: int) -> int:
    letter = text_field(row, field, name).strip().upper()
    if len(letter) != 1 or letter not in LETTERS[:n]:
        raise RowError(f"{name}: field {field!r} must be one of {LETTERS[:n]!r}, got {letter!r}")
    return LETTERS.index(letter)


def mmlu_pro_item(row: Mapping[str, object], index: int) -> BenchmarkItem:
    options = _options(row, "options", "mmlu_pro")
    correct = _letter(row, "answer", "mmlu_pro", len(options))
    return _choice(row.get("question_id", index), text_field(row, "question", "mmlu_pro"), options, correct)


def supergpqa_item(row: Mapping[str, object], index: int) -> BenchmarkItem:
    options = _options(row, "options", "supergpqa")
    correct = _letter(row, "answer_letter", "supergpqa", len(options))
    return _choice(row.get("uuid", index), text_field(row, "question", "supergpqa"), options, correct)


def mmlu_redux_item(row: Mapping[str, object], index: int) -> BenchmarkItem | None:
    """None for a question the re-annotation found wrong (``error_type`` other than ``ok``)."""
    if row.get("error_type", "ok") != "ok":
        return None
    options = _options(row, "choices", "mmlu_redux")
    answer = row.get("answer")
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(options):
        raise RowError(
            f"mmlu_redux: field 'answer' must be an option index 0..{len(options) - 1}, got {answer!r}"
        )
    return _choice(row.get("id", index), text_field(row, "question", "mmlu_redux"), options, answer)


def gpqa_item(row: Mapping[str, object], index: int) -> BenchmarkItem:
    correct = text_field(row, "Correct Answer", "gpqa").strip()
    wrong = [text_field(row, f"Incorrect Answer {i}", "gpqa").strip() for i in (1, 2, 3)]
    ident = row.get("Record ID", index)
    options = [correct, *wrong]
    random.Random(item_seed("gpqa-options", str(ident))).shuffle(options)
    return _choice(ident, text_field(row, "Question", "gpqa"), options, options.index(correct))


def ifeval_item(row: Mapping[str, object], index: int) -> BenchmarkItem:
    ids = [str(i) for i in _list_field(row, "instruction_id_list", "ifeval")]
    kwargs = ifeval.validate(ids, _list_field(row, "kwargs", "ifeval"))
    prompt = text_field(row, "prompt", "ifeval")
    return BenchmarkItem(
        str(row.get("key", index)), prompt, f"{len(ids)} instructions", {"ids": ids, "kwargs": kwargs}
    )


def mbpp_item(row: Mapping[str, object], index: int) -> BenchmarkItem:
    field = "text" if "text" in row else "prompt"
    text = text_field(row, field, "mbpp")
    tests = _list_field(row, "test_list", "mbpp")
    if not all(isinstance(t, str) and t.strip() for t in tests):
        raise RowError(f"mbpp: field 'test_list' must hold non-empty assert statements, got {tests!r}")
    setup = row.get("test_setup_code") or ""
    imports = row.get("test_imports") or []
    if isinstance(imports, list) and imports and not setup:  # the sanitized config
        setup = "\n".join(str(i) for i in imports)  # pyright: ignore[reportUnknownVariableType]
    if not isinstance(setup, str):
        raise RowError(f"mbpp: field 'test_setup_code' must be text, got {setup!r}")
    shown = "\n".join(str(t) for t in tests)
    prompt = f"{text.strip()}\nYour code should pass these tests:\n\n{shown}"
    code = row.get("code")
    answer = code if isinstance(code, str) and code.strip() else "(tests)"
    return BenchmarkItem(
        str(row.get("task_id", index)), prompt, answer, {"tests": [str(t) for t in tests], "setup": setup}
    )
