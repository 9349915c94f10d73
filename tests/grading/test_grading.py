"""The math grader: the table of (response, reference, expected) cases, extraction and
normalisation pinned one by one, the time limit (a pathological sympy call is a counted timeout
with reward 0), bad input, pickling, and concurrent use from threads and an event loop."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import pickle
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from grading_cases import CASES

import tempering.grading
from tempering.grading import GradeResult, MathGrader, close_workers, extract_answer, normalize_answer
from tempering.grading._pool import CheckError, _Worker, shared_pool  # pyright: ignore[reportPrivateUsage]

# Generous: the table is about correctness, and CI cores are shared. The timeout tests use 1 s.
TABLE_TIMEOUT_S = 30.0
# 2^(2^40) makes sympy build a 2^40-bit integer: minutes of work and more memory than a machine.
PATHOLOGICAL = "\\boxed{2^{2^{40}}}"


@pytest.fixture(scope="module")
def grader() -> MathGrader:
    grader = MathGrader(timeout_s=TABLE_TIMEOUT_S, workers=1)
    grader.warm_up()
    return grader


def test_table_has_at_least_100_cases_with_unique_ids() -> None:
    ids = [case[0] for case in CASES]
    assert len(ids) >= 100
    assert len(set(ids)) == len(ids)
    assert sum(case_id.startswith("adv-") for case_id in ids) >= 15
    assert {expected for *_, expected in CASES} == {True, False}


@pytest.mark.parametrize(
    ("response", "reference", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_table(grader: MathGrader, response: str, reference: str, expected: bool) -> None:
    result = grader.grade(response, reference)
    assert not result.timed_out
    assert result.correct is expected, result
    assert result.reward == (1.0 if expected else 0.0)


@pytest.mark.parametrize(
    ("text", "style", "expected"),
    [
        ("\\boxed{\\frac{1}{\\sqrt{2}}}", "boxed", "\\frac{1}{\\sqrt{2}}"),
        ("\\boxed{a} and \\boxed{b}", "boxed", "b"),
        ("\\boxed 12.", "boxed", "12"),
        ("\\boxed{\\{1,2\\}}", "boxed", "\\{1,2\\}"),
        ("\\boxed{7", "boxed", None),
        ("\\boxed{7", "auto", None),
        ("\\boxedfoo{7}", "boxed", None),
        ("no box 7", "boxed", None),
        ("\\fbox{3}", "boxed", "3"),
        ("x\n#### 1,000\nmore", "gsm8k", "1,000"),
        ("#### ", "gsm8k", None),
        ("\\boxed{5} #### 6", "gsm8k", "6"),
        ("it is 3 or -4.5", "last_number", "-4.5"),
        ("we get 12,345 in total", "last_number", "12,345"),
        ("so 3/4.", "last_number", "3/4"),
        ("no digits", "last_number", None),
        ("x2 and 5cm", "last_number", "5"),
        ("The answer is $5$.", "auto", "5"),
        ("The answer is 5. Then 6 more", "auto", "5"),
        ("#### 9", "auto", "9"),
        ("1 2 3", "auto", "3"),
        ("", "auto", None),
    ],
)
def test_extract_answer(text: str, style: str, expected: str | None) -> None:
    assert extract_answer(text, style) == expected  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("\\$1{,}000", "1000"),
        ("\\dfrac12", "\\frac{1}{2}"),
        ("\\tfrac{3}{4}", "\\frac{3}{4}"),
        ("5\\text{ cm}", "5"),
        ("12 inches", "12"),
        ("x = 2.50", "2.5"),
        ("50\\%", "50"),
        ("90^\\circ", "90"),
        ("-3/4", "-\\frac{3}{4}"),
        ("1,000,000", "1000000"),
        ("(1,2)", "(1,2)"),
        ("\\left( 1, 2 \\right]", "(1,2]"),
        (".5", "0.5"),
        ("-0.0", "0"),
        ("2x", "2x"),
        ("$\\sqrt2$", "\\sqrt{2}"),
        ("\\text{\\textbf{yes}}", "yes"),
        ("7.", "7"),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_pathological_sympy_call_is_a_counted_timeout_with_reward_zero() -> None:
    grader = MathGrader(timeout_s=1.0, workers=1)
    grader.warm_up()
    start = time.perf_counter()
    result = grader.grade(PATHOLOGICAL, "1")
    elapsed = time.perf_counter() - start
    assert result == GradeResult(0.0, False, "2^{2^{40}}", timed_out=True, error=None)
    assert elapsed < 5.0  # bounded by the limit (plus killing the worker), not by sympy
    assert result.metrics()["grader/timeouts"] == 1.0
    metrics = grader.metrics()
    assert metrics["grader/timeouts"] == 1.0
    assert metrics["grader/calls"] == 1.0
    # The killed worker was replaced: the next call is graded normally.
    assert grader.grade("\\boxed{\\frac{1}{2}}", "0.5").correct
    assert grader.metrics(reset=True)["grader/calls"] == 2.0
    assert grader.metrics()["grader/calls"] == 0.0


def test_timeout_from_threads_does_not_hang_the_others() -> None:
    """math-verify's own timeout (signal.alarm) fails off the main thread; ours does not."""
    grader = MathGrader(timeout_s=1.0, workers=2)
    grader.warm_up()
    jobs = [(PATHOLOGICAL, "1"), ("\\boxed{\\frac{2}{4}}", "0.5")] * 2
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda job: grader.grade(*job), jobs))  # pyright: ignore[reportUnknownLambdaType]
    assert [r.timed_out for r in results] == [True, False, True, False]
    assert [r.correct for r in results] == [False, True, False, True]
    assert grader.metrics()["grader/timeouts"] == 2.0


def test_agrade_concurrently_from_threads_and_an_event_loop(grader: MathGrader) -> None:
    cases = [(f"\\boxed{{\\frac{{{2 * i}}}{{2}}}}", str(i)) for i in range(8)]
    cases += [(f"\\boxed{{\\frac{{{i}}}{{3}}}}", str(i)) for i in range(1, 5)]

    async def grade_all() -> list[GradeResult]:
        return await asyncio.gather(*(grader.agrade(r, ref) for r, ref in cases))

    def in_thread(_: int) -> list[bool]:
        return [r.correct for r in asyncio.run(grade_all())]

    with ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(in_thread, range(3)))
    assert outcomes == [[True] * 8 + [False] * 4] * 3


def test_in_process_mode_grades_the_same(grader: MathGrader) -> None:
    inline = MathGrader(timeout_s=None)
    sample = [case for case in CASES if not case[0].startswith("adv-")][:40]
    assert [inline.grade(r, ref).correct for _, r, ref, _ in sample] == [
        grader.grade(r, ref).correct for _, r, ref, _ in sample
    ]


@pytest.mark.parametrize("bad", [None, 7, b"\\boxed{7}", ["7"]])
def test_non_string_input_is_a_clear_type_error(grader: MathGrader, bad: object) -> None:
    with pytest.raises(TypeError, match=r"response must be a str"):
        grader.grade(bad, "7")  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=r"reference must be a str"):
        grader.grade("\\boxed{7}", bad)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=r"response must be a str"):
        asyncio.run(grader.agrade(bad, "7"))  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=r"text must be a str"):
        extract_answer(bad)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=r"s must be a str"):
        normalize_answer(bad)  # pyright: ignore[reportArgumentType]


def test_bad_configuration_is_a_clear_value_error() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        MathGrader(timeout_s=0)
    with pytest.raises(ValueError, match="workers"):
        MathGrader(workers=0)
    with pytest.raises(ValueError, match="style"):
        MathGrader(style="latex")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="style"):
        extract_answer("7", style="latex")  # pyright: ignore[reportArgumentType]


def test_pickle_round_trip_keeps_config_and_grades(grader: MathGrader) -> None:
    custom = MathGrader(
        style="gsm8k", timeout_s=TABLE_TIMEOUT_S, correct_reward=2.0, incorrect_reward=-1.0, workers=1
    )
    custom.grade("#### 5", "5")
    copy = pickle.loads(pickle.dumps(custom))
    assert copy == custom
    assert copy.metrics()["grader/calls"] == 0.0  # a copy counts its own calls
    assert copy.grade("#### 1/2", "0.5").reward == 2.0
    assert copy.grade("\\boxed{5}", "5").reward == -1.0  # gsm8k style ignores boxes
    assert copy(r"#### 7", "7") == 2.0  # and a MathGrader is a (response, answer) -> reward grader
    assert pickle.loads(pickle.dumps(grader)) == grader


def test_metrics_count_each_outcome() -> None:
    grader = MathGrader(timeout_s=TABLE_TIMEOUT_S, workers=1, max_answer_chars=10)
    outcomes = [
        grader.grade("\\boxed{4}", "4"),
        grader.grade("nothing here", "4"),
        grader.grade("\\boxed{12345678901}", "4"),
        grader.grade("\\boxed{5}", "4"),
    ]
    assert [r.error is not None for r in outcomes] == [False, False, True, False]
    assert outcomes[1].extracted is None
    metrics = grader.metrics()
    assert {
        k: metrics[k] for k in ("grader/calls", "grader/correct", "grader/no_answer", "grader/errors")
    } == {
        "grader/calls": 4.0,
        "grader/correct": 1.0,
        "grader/no_answer": 1.0,
        "grader/errors": 1.0,
    }
    assert metrics["grader/fast_path"] == 4.0  # all four decided without sympy


def test_a_dead_worker_is_an_error_then_replaced() -> None:
    grader = MathGrader(timeout_s=TABLE_TIMEOUT_S, workers=1, memory_limit_mb=3072)
    grader.warm_up()
    pool = shared_pool(1, 3072)
    restarts = pool.restarts
    worker = pool._idle.get()
    worker.proc.kill()
    worker.proc.wait()
    pool._idle.put(worker)
    result = grader.grade("\\boxed{\\frac{1}{2}}", "0.5")
    assert result.error is not None
    assert result.reward == 0.0
    assert pool.restarts == restarts + 1
    assert grader.grade("\\boxed{\\frac{1}{2}}", "0.5").correct


def test_close_workers_then_grading_starts_new_ones() -> None:
    grader = MathGrader(timeout_s=TABLE_TIMEOUT_S, workers=1, memory_limit_mb=2048)
    assert grader.grade("\\boxed{\\frac{1}{2}}", "0.5").correct
    pool = shared_pool(1, 2048)
    processes = [w.proc for w in pool._all]
    close_workers()
    assert all(p.poll() is not None for p in processes)
    assert grader.grade("\\boxed{\\frac{1}{2}}", "0.5").correct


def test_grading_imports_only_low_layers() -> None:
    """grading/ sits under envs: stdlib, attrs/numpy, tempering_protocols, itself, and math-verify
    (lazily, inside a function). A top-level import of envs, rl, training... would fail here."""
    package = Path(tempering.grading.__file__).parent
    allowed_roots = {"attrs", "numpy", "tempering_protocols", "__future__"} | set(sys.stdlib_module_names)
    for source in sorted(package.glob("*.py")):
        tree = ast.parse(source.read_text())
        for node in tree.body:  # module level only: math-verify is imported lazily
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module]
            for name in names:
                ok = name.split(".")[0] in allowed_roots or name.startswith("tempering.grading")
                assert ok, f"{source.name} imports {name}"


def test_a_pipe_closed_under_a_waiting_read_is_a_check_error() -> None:
    """``close_workers`` closes a worker's pipe while another thread waits on it: that read ends
    as "the checker process exited", not an ``OSError`` (Bad file descriptor) out of ``select``
    or ``os.read``, which is what a loaded machine made of the race before."""
    worker = _Worker(None)
    try:
        worker.wait_ready()
        stdout = worker.proc.stdout
        assert stdout is not None
        os.close(stdout.fileno())  # the descriptor gone, as kill() in another thread leaves it
        with pytest.raises(CheckError, match="the checker process exited"):
            worker._read_line(time.monotonic() + 5.0)  # pyright: ignore[reportPrivateUsage]
    finally:
        worker.proc.kill()
        worker.proc.wait()
        for stream in (worker.proc.stdin, worker.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()


def test_close_workers_during_a_check_ends_it_as_an_error() -> None:
    grader = MathGrader(timeout_s=60.0, workers=1, memory_limit_mb=None)
    grader.warm_up()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(grader.grade, PATHOLOGICAL, "1")
        time.sleep(0.5)
        start = time.perf_counter()
        close_workers()
        result = pending.result(timeout=30)
    assert time.perf_counter() - start < 10.0  # not the 60 s limit
    assert result.error == "the checker process exited"
    assert not result.timed_out
    assert result.reward == 0.0
    assert grader.grade("\\boxed{\\frac{1}{2}}", "0.5").correct  # a fresh pool
