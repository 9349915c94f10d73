"""Benchmark data (each benchmark's schema, read from local files), the suite's checks, and the
statistics of an evaluation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tempering.data import DataError
from tempering.evals.benchmarks import (
    BENCHMARKS,
    CHOICE_INSTRUCTION,
    CODE_INSTRUCTION,
    Benchmark,
    UnknownBenchmarkError,
    get_benchmark,
    load_items,
)
from tempering.evals.stats import item_seed, sample_std, wilson_interval
from tempering.evals.suite import EvalSuite, known_benchmarks

FIXTURES = Path(__file__).parent / "fixtures"


def test_each_schema_reads_its_fixture() -> None:
    gsm = load_items(get_benchmark("gsm8k"), FIXTURES / "gsm8k.jsonl")
    assert [i.answer for i in gsm] == ["6", "43", "150", "80", "17", "52"]
    assert gsm[0].prompt.startswith("A baker makes 24 muffins")
    assert get_benchmark("gsm8k").prompt(gsm[0]).endswith("within \\boxed{}.")
    math500 = load_items(get_benchmark("math500"), FIXTURES / "math500.jsonl", limit=2)
    assert [(i.id, i.answer) for i in math500] == [
        ("test/prealgebra/1.json", "\\frac{5}{6}"),
        ("test/algebra/2.json", "6"),
    ]
    aime = load_items(get_benchmark("aime24"), str(FIXTURES / "aime.jsonl"))
    assert [(i.id, i.answer) for i in aime] == [("1", "15"), ("2", "49"), ("3", "19")]


def test_the_instruction_follows_the_kind_unless_given() -> None:
    def bench(**kw: str) -> Benchmark:
        return Benchmark(name="b", description="d", hub_name="h", **kw)  # pyright: ignore[reportArgumentType]

    assert bench(kind="choice").instruction == CHOICE_INSTRUCTION
    assert bench(kind="code").instruction == CODE_INSTRUCTION
    assert bench(kind="ifeval").instruction == ""
    assert bench().instruction.endswith("within \\boxed{}.")
    assert bench(kind="choice", instruction="Answer with a letter.").instruction == "Answer with a letter."
    assert {b.instruction for b in BENCHMARKS.values() if b.kind == "choice"} == {CHOICE_INSTRUCTION}


def test_a_row_without_a_field_names_the_file_the_row_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": "q", "answer": "x\n#### 1"}, {"question": "q2", "solution": "#### 2"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"gsm\.jsonl:2: gsm8k: missing field 'answer'") as err:
        load_items(get_benchmark("gsm8k"), path)
    assert err.value.line == 2
    path.write_text(json.dumps({"question": "q", "answer": "no final answer"}) + "\n")
    with pytest.raises(DataError, match="has no '#### <answer>' line"):
        load_items(get_benchmark("gsm8k"), path)


def test_missing_data_file_and_bad_limit_are_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"math500: no data file .*nothing\.jsonl"):
        load_items(get_benchmark("math500"), tmp_path / "nothing.jsonl")
    with pytest.raises(ValueError, match="limit must be at least 1"):
        load_items(get_benchmark("math500"), FIXTURES / "math500.jsonl", limit=0)


def test_an_unknown_benchmark_lists_the_known_ones() -> None:
    with pytest.raises(UnknownBenchmarkError, match="unknown benchmark 'gsm9k'; known benchmarks: ") as err:
        EvalSuite(benchmarks=("gsm9k",))
    for name in [*BENCHMARKS, "nll"]:
        assert name in str(err.value)
    assert set(known_benchmarks()) == {
        *("gsm8k", "math500", "aime24", "aime25", "nll", "ifeval", "mmlu_pro", "gpqa"),
        *("supergpqa", "mmlu_redux", "mbpp"),
    }


def test_data_entries_are_matched_to_benchmarks() -> None:
    one = EvalSuite(benchmarks=("gsm8k",), data=("a.jsonl",))
    assert one.data_paths() == {"gsm8k": "a.jsonl"}
    two = EvalSuite(benchmarks=("gsm8k", "nll"), data=("gsm8k=a.jsonl", "nll=b.jsonl"))
    assert two.data_paths() == {"gsm8k": "a.jsonl", "nll": "b.jsonl"}
    with pytest.raises(ValueError, match="give each data file as NAME=PATH"):
        EvalSuite(benchmarks=("gsm8k", "nll"), data=("a.jsonl",))
    with pytest.raises(ValueError, match="benchmark 'math500' is not being run"):
        EvalSuite(benchmarks=("gsm8k",), data=("math500=a.jsonl",))


def test_wilson_interval_matches_the_formula() -> None:
    low, high = wilson_interval(37, 50)
    # Wilson 95%: centre (p + z²/2n)/(1 + z²/n), half-width z sqrt(p(1-p)/n + z²/4n²)/(1 + z²/n).
    assert (round(low, 4), round(high, 4)) == (0.6045, 0.8413)  # by hand: 0.60446, 0.84128
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_sample_std_is_the_spread_of_per_pass_accuracy() -> None:
    # pass 0: items 1, 1, 0 -> 2/3; pass 1: 0, 1, 0 -> 1/3
    assert sample_std([[1, 0], [1, 1], [0, 0]]) == pytest.approx(math.sqrt(2 * (1 / 6) ** 2))
    assert sample_std([[1], [0]]) == 0.0


def test_item_seeds_are_distinct_and_stable() -> None:
    seeds = {item_seed(0, "gsm8k", i, s) for i in range(50) for s in range(4)}
    assert len(seeds) == 200
    assert item_seed(0, "gsm8k", 3, 1) == item_seed(0, "gsm8k", 3, 1)
    assert item_seed(0, "gsm8k", 3, 1) != item_seed(1, "gsm8k", 3, 1)
    assert all(0 <= s < 2**63 for s in seeds)
