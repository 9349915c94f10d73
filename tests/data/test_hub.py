"""Math datasets through ``datasets.load_dataset``: local copies in each hub dataset's schema.

The fixtures under ``hub_fixtures/`` are small directories laid out as ``load_dataset`` reads a
dataset directory (split files, or ``data/train-*.parquet`` as on the hub), with each dataset's
real field names; the same code path reads the hub by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dataset_helpers import WriteRows

from tempering.data import DataError
from tempering.data.hub import MATH_DATASETS, MathDatasetSpec, hub_rows, load_math_problems

FIXTURES = Path(__file__).resolve().parent / "hub_fixtures"

EXPECTED = {
    ("gsm8k", "train"): ["12", "1500", "30"],
    ("gsm8k", "test"): ["26", "3"],
    ("math500", "test"): ["\\left( 3, \\frac{\\pi}{2} \\right)", "\\frac{5}{6}"],
    ("math", "train"): ["4", "5\\sqrt{2}"],
    ("math", "test"): ["\\dfrac{3}{4}"],
    ("deepmath", "train"): ["1", "9"],
    ("polaris", "train"): ["13", "8"],
    ("aime", "train"): ["24", "1001"],
}


@pytest.mark.parametrize(("name", "split"), list(EXPECTED))
def test_each_dataset_reads_its_schema(name: str, split: str) -> None:
    problems = load_math_problems(name, source=FIXTURES / name, split=split)
    assert [p.answer for p in problems] == EXPECTED[name, split]
    assert all(p.question.strip() for p in problems)
    assert problems[0].origin.endswith(f"[{split}]: row 1")


def test_every_known_dataset_has_a_fixture_and_a_default_split() -> None:
    assert {name for name, _ in EXPECTED} == set(MATH_DATASETS)
    assert MATH_DATASETS["gsm8k"].default_split == "test"
    assert MATH_DATASETS["deepmath"].default_split == "train"
    assert MATH_DATASETS["gsm8k"].hub == "openai/gsm8k"
    assert MATH_DATASETS["gsm8k"].config == "main"


def test_a_single_file_is_the_requested_split_and_limit_stops_early() -> None:
    problems = load_math_problems("deepmath", source=FIXTURES / "deepmath" / "train.parquet", limit=1)
    assert [p.answer for p in problems] == ["1"]
    rows = list(hub_rows("json", data_files=str(FIXTURES / "gsm8k" / "test.jsonl")))
    assert len(rows) == 2
    assert "#### 26" in str(rows[0]["answer"])


def test_a_missing_field_names_the_dataset_row_and_field(write_jsonl: WriteRows) -> None:
    path = write_jsonl(
        "bad.jsonl",
        [{"question": "1 + 1?", "answer": "#### 2"}, {"question": "2 + 2?", "solution": "#### 4"}],
    )
    with pytest.raises(DataError) as info:
        load_math_problems("gsm8k", source=path, split="test")
    message = str(info.value)
    assert message.startswith("gsm8k (")
    assert "row 2: no field 'answer'" in message
    assert "solution" in message  # the fields the row does have
    assert info.value.line == 2


def test_an_answer_without_its_marker_is_refused(write_jsonl: WriteRows) -> None:
    gsm = write_jsonl("gsm.jsonl", [{"question": "1 + 1?", "answer": "it is 2"}])
    with pytest.raises(DataError, match=r"row 1: field 'answer' has no '#### answer' line"):
        load_math_problems("gsm8k", source=gsm)
    math = write_jsonl("math.jsonl", [{"problem": "x?", "solution": "x = 3"}])
    with pytest.raises(DataError, match=r"row 1: field 'solution' has no \\boxed"):
        load_math_problems("math", source=math, split="train")


def test_an_empty_field_is_refused(write_jsonl: WriteRows) -> None:
    path = write_jsonl("empty.jsonl", [{"problem": "  ", "answer": "3"}])
    with pytest.raises(DataError, match=r"polaris .*row 1: field 'problem' is '  '"):
        load_math_problems("polaris", source=path)


def test_a_custom_spec_maps_other_fields(write_jsonl: WriteRows) -> None:
    path = write_jsonl("mine.jsonl", [{"prompt": "What is 6 * 7?", "target": 42}])
    spec = MathDatasetSpec(
        "mine", hub="me/mine", splits=("train",), question_field="prompt", answer_field="target"
    )
    [problem] = load_math_problems(spec, source=path)
    assert (problem.question, problem.answer) == ("What is 6 * 7?", "42")


def test_unknown_names_and_unreadable_sources_are_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="unknown math dataset 'gsm9k'; known: gsm8k, math500"):
        load_math_problems("gsm9k")
    with pytest.raises(ValueError, match=r"\[validation\] could not be loaded"):
        load_math_problems("gsm8k", source=FIXTURES / "gsm8k", split="validation")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    with pytest.raises(ValueError, match=r"tempering-test/no-such-dataset .*could not be loaded.*local copy"):
        load_math_problems("gsm8k", source="tempering-test/no-such-dataset")
