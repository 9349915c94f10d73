"""The non-math benchmarks: each schema read from its fixture, malformed rows named, the
multiple-choice grader as a table, MBPP graded in the local sandbox, the hub-less error, and
each benchmark through the evaluator with scripted replies (known figures)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker
from tinker import types as ttypes

from tempering.backend import ModelConfig, load_tokenizer
from tempering.data import DataError
from tempering.evals.benchmarks import BenchmarkDataMissingError, get_benchmark, load_items
from tempering.evals.graders import extract_choice, item_grader
from tempering.evals.math_bench import BenchmarkEvaluator
from tempering.evals.suite import EvalSuite
from tempering.renderers import get_renderer

FIXTURES = Path(__file__).parent / "fixtures"
pytestmark = pytest.mark.timeout(120)


def test_each_schema_reads_its_fixture() -> None:
    pro = load_items(get_benchmark("mmlu_pro"), FIXTURES / "mmlu_pro.jsonl")
    assert [(i.id, i.answer, i.meta["letters"]) for i in pro] == [
        ("70", "B", "ABCDEFGHIJ"),
        ("71", "C", "ABCD"),
    ]
    assert "\nB. Unsafe practices\n" in pro[0].prompt
    assert get_benchmark("mmlu_pro").prompt(pro[0]).endswith("letter of the correct option.")
    gpqa = load_items(get_benchmark("gpqa"), FIXTURES / "gpqa.jsonl")
    for item, correct in zip(gpqa, ("The photon", "sp3"), strict=True):
        assert f"\n{item.answer}. {correct}" in item.prompt  # the letter points at the correct answer
    assert load_items(get_benchmark("gpqa"), FIXTURES / "gpqa.jsonl") == gpqa  # the same order every run
    sg = load_items(get_benchmark("supergpqa"), FIXTURES / "supergpqa.jsonl")
    assert [(i.id, i.answer) for i in sg] == [("a1b2", "B")]
    redux = load_items(get_benchmark("mmlu_redux"), FIXTURES / "mmlu_redux.jsonl")
    assert [i.answer for i in redux] == ["B", "C"]  # the mislabelled middle row is left out
    ife = load_items(get_benchmark("ifeval"), FIXTURES / "ifeval.jsonl")
    assert [i.id for i in ife] == ["1000", "1001", "1005", "1012"]
    assert ife[1].meta["kwargs"] == [
        {"relation": "less than", "num_words": 20},
        {"relation": "less than", "num_words": 40},
    ]
    assert get_benchmark("ifeval").prompt(ife[0]) == ife[0].prompt  # asked as written
    mbpp = load_items(get_benchmark("mbpp"), FIXTURES / "mbpp.jsonl")
    assert mbpp[0].meta["tests"][0] == 'assert remove_Occ("hello","l") == "heo"'
    assert mbpp[1].meta["setup"] == "import math"
    assert "Your code should pass these tests" in mbpp[0].prompt
    assert "```python" in get_benchmark("mbpp").prompt(mbpp[0])


@pytest.mark.parametrize(
    ("name", "row", "message"),
    [
        (
            "mmlu_pro",
            {"question": "q", "options": ["a", "b"], "answer": "E"},
            r"field 'answer' must be one of 'AB'",
        ),
        ("mmlu_pro", {"question": "q", "answer": "A"}, r"missing field 'options'"),
        (
            "gpqa",
            {"Question": "q", "Correct Answer": "x", "Incorrect Answer 1": "y", "Incorrect Answer 2": "z"},
            r"missing field 'Incorrect Answer 3'",
        ),
        (
            "supergpqa",
            {"question": "q", "options": ["a", ""], "answer_letter": "A"},
            r"field 'options': option 1 must be non-empty",
        ),
        (
            "mmlu_redux",
            {"question": "q", "choices": ["a", "b"], "answer": 2},
            r"field 'answer' must be an option index 0\.\.1",
        ),
        (
            "ifeval",
            {"key": 1, "prompt": "p", "instruction_id_list": ["x:y"], "kwargs": [{}]},
            r"instruction 0 \('x:y'\): unknown instruction id",
        ),
        (
            "mbpp",
            {"task_id": 1, "text": "t", "test_list": []},
            r"field 'test_list' must be a list of at least 1",
        ),
    ],
)
def test_a_malformed_row_names_the_file_the_row_and_the_field(
    tmp_path: Path, name: str, row: dict[str, Any], message: str
) -> None:
    good = (FIXTURES / f"{name}.jsonl").read_text().splitlines()[0]
    path = tmp_path / f"{name}.jsonl"
    path.write_text(good + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"{name}\.jsonl:2: {name}: .*{message}") as err:
        load_items(get_benchmark(name), path)
    assert err.value.line == 2


def test_no_hub_and_no_local_copy_says_where_to_place_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPERING_BENCHMARK_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(
        BenchmarkDataMissingError, match=r"benchmark gpqa: cannot read Idavidrein/gpqa"
    ) as err:
        load_items(get_benchmark("gpqa"), limit=1)
    assert f"at {tmp_path / 'gpqa.jsonl'}" in str(err.value)
    assert "--data gpqa=PATH" in str(err.value)
    # a copy placed there is read instead of the hub
    (tmp_path / "gpqa.jsonl").write_text((FIXTURES / "gpqa.jsonl").read_text())
    assert [i.id for i in load_items(get_benchmark("gpqa"))] == ["recA1", "recB2"]


CHOICES: list[tuple[str, str | None]] = [
    ("The force is measured in newtons.\nAnswer: C", "C"),
    ("so the answer is (B).", "B"),
    ("**Answer:** D", "D"),
    ("The answer is: A", "A"),
    ("Answer: A, not B", "A"),
    ("First I thought Answer: A. On reflection, Answer: D", "D"),  # the last one counts
    ("\\boxed{B}", "B"),
    ("C", "C"),
    ("(D).", "D"),
    ("", None),  # empty
    ("Answer: A or B", None),  # a hedge
    ("Answer: A/B", None),
    ("Answer: E", None),  # not an option of a four-option question
    ("Newton", None),  # the option's text, not its letter (the wrong field)
    ("the answer is a secret", None),  # an article, not a letter
]


@pytest.mark.parametrize(("reply", "expected"), CHOICES)
def test_choice_extraction_table(reply: str, expected: str | None) -> None:
    assert extract_choice(reply, "ABCD") == expected


def test_mbpp_is_graded_in_the_sandbox() -> None:
    bench = get_benchmark("mbpp")
    item = load_items(bench, FIXTURES / "mbpp.jsonl")[0]
    grade = item_grader(bench, code_timeout_s=3.0)
    right = f"Here:\n```python\n{item.answer}\n```"
    half = "```python\ndef remove_Occ(s, ch):\n    return s.strip(ch)\n```"
    loops = "```python\ndef remove_Occ(s, ch):\n    while True:\n        pass\n```"

    async def run() -> list[Any]:
        return list(
            await asyncio.gather(
                grade(right, item),
                grade(half, item),
                grade("def remove_Occ(s, ch): ...", item),
                grade(loops, item),
            )
        )

    good, partial, unfenced, hang = asyncio.run(run())
    assert good.correct
    assert good.score == 1.0
    assert not partial.correct
    assert partial.score == pytest.approx(2 / 3)
    assert not unfenced.correct
    assert unfenced.extracted is None
    assert not hang.correct
    assert hang.score == 0.0


class _Scripted:
    """Replies with a fixed text chosen by a substring of the prompt."""

    def __init__(self, renderer: Any, tokenizer: Any, replies: dict[str, str]) -> None:
        self.renderer, self.tokenizer, self.replies = renderer, tokenizer, replies

    async def sample(self, prompt: tinker.ModelInput, n: int, params: tinker.SamplingParams) -> Any:
        text = self.tokenizer.decode(prompt.to_ints())
        (key,) = [k for k in self.replies if k in text]
        tokens = [
            *self.tokenizer.encode(self.replies[key], add_special_tokens=False),
            *self.renderer.get_stop_sequences(),
        ]
        seq = ttypes.SampledSequence(stop_reason="stop", sequence_id="s", tokens_np=np.array(tokens))
        return ttypes.SampleResponse(sequences=[seq] * n)


@pytest.mark.parametrize(
    ("name", "replies", "pass_at_1", "partial"),
    [
        ("mmlu_pro", {"adverts": "Answer: B", "unit of force": "Answer: A"}, 0.5, None),
        ("mmlu_redux", {"degree": "Answer: B", "prime": "I am not sure."}, 0.5, None),
        (
            "ifeval",
            {
                "wikipedia": "*a* *b* *c* short, with commas",  # 1 of 3 followed
                "cat in fewer": "A small cat.",  # both followed
                "limerick": "There once was a frog.",  # the prompt is not repeated
                "capital letters": "RAIN FALLS ON THE TOWN. ANY OTHER QUESTIONS?",  # both
            },
            0.5,
            (1 / 3 + 1 + 0 + 1) / 4,
        ),
    ],
)
def test_the_evaluator_reports_each_kind(
    name: str, replies: dict[str, str], pass_at_1: float, partial: float | None
) -> None:
    tokenizer = load_tokenizer("tempering/tiny")
    renderer = get_renderer("chatml", tokenizer)
    bench = get_benchmark(name)
    evaluator = BenchmarkEvaluator(
        bench, load_items(bench, FIXTURES / f"{name}.jsonl"), renderer, num_samples=2
    )
    metrics = asyncio.run(evaluator(_Scripted(renderer, tokenizer, replies)))  # pyright: ignore[reportArgumentType]
    assert metrics[f"{name}/pass@1"] == pytest.approx(pass_at_1)
    assert metrics[f"{name}/pass@1_ci_low"] < pass_at_1 < metrics[f"{name}/pass@1_ci_high"]
    assert (f"{name}/pass@1_loose" in metrics) is (name == "ifeval")
    if partial is None:
        assert f"{name}/partial_credit" not in metrics
    else:
        assert metrics[f"{name}/partial_credit"] == pytest.approx(partial)


def test_a_training_runs_suite_builds_the_graded_benchmarks() -> None:
    data = tuple(f"{n}={FIXTURES / (n + '.jsonl')}" for n in ("ifeval", "mbpp", "gpqa"))
    suite = EvalSuite(benchmarks=("ifeval", "mbpp", "gpqa"), data=data, limit=1, grader_timeout_s=2.0)
    evaluators = suite.build(ModelConfig())
    assert [e.benchmark.kind for e in evaluators if isinstance(e, BenchmarkEvaluator)] == [
        "ifeval",
        "code",
        "choice",
    ]
    mbpp = evaluators[1]
    assert isinstance(mbpp, BenchmarkEvaluator)
    assert mbpp.item_grader is not None
    loops = "```python\nwhile True:\n    pass\n```"
    started = time.monotonic()
    graded = asyncio.run(mbpp.item_grader(loops, mbpp.items[0]))
    assert not graded.correct
    assert time.monotonic() - started < 6, "the suite's grader_timeout_s limits a program run"


def test_every_grader_is_a_picklable_value() -> None:
    import pickle

    for name in ("gsm8k", "mmlu_pro", "ifeval", "mbpp"):
        grader = item_grader(get_benchmark(name))
        assert pickle.loads(pickle.dumps(grader)) == grader
