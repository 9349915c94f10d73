"""``tempering eval`` offline on the GSM8K fixture: against the local engine (in-process) and
against a ``tempering serve`` subprocess; bad benchmark names and ``--list``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tempering.cli import main
from tempering.evals.report import read_report
from tempering.evals.stats import item_seed
from tempering.serve.testing import API_KEY, ServerProcess, collect_sdk_garbage

FIXTURE = str(Path(__file__).parent / "fixtures" / "gsm8k.jsonl")
pytestmark = [
    pytest.mark.timeout(300),
    # the tinker SDK never closes the pool of its /client/config call (tests/serve/conftest.py)
    pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning"),
]


@pytest.fixture
def local_env(monkeypatch: pytest.MonkeyPatch, local_root: Path) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.setenv("TEMPERING_HOME", str(local_root))
    monkeypatch.setenv("TEMPERING_DEVICE", "cpu")
    monkeypatch.setenv("TEMPERING_DTYPE", "float32")
    monkeypatch.setenv("TEMPERING_NUM_THREADS", "1")


def _check_report(path: Path, backend: str) -> dict[str, object]:
    report = read_report(path)
    assert report["model"]["base_model"] == "tempering/tiny"
    assert report["model"]["backend"].startswith(backend)
    (result,) = report["results"]
    assert result["benchmark"] == "gsm8k"
    assert result["n_items"] == 4
    assert result["num_samples"] == 2
    items = result["items"]
    assert [i["answer"] for i in items] == ["6", "43", "150", "80"]
    samples = [s for i in items for s in i["samples"]]
    assert [s["seed"] for s in samples] == [item_seed(3, "gsm8k", i, s) for i in range(4) for s in range(2)]
    assert all(s["tokens"] > 0 for s in samples)
    correct = [s["correct"] for s in samples]
    assert result["metrics"]["pass@1"] == sum(correct) / len(correct)
    assert (
        result["metrics"]["pass@1_ci_low"]
        <= result["metrics"]["pass@1"]
        <= result["metrics"]["pass@1_ci_high"]
    )
    return result


ARGS = [
    "--data",
    FIXTURE,
    "--limit",
    "4",
    "--num-samples",
    "2",
    "--max-tokens",
    "8",
    "--temperature",
    "1.0",
    "--seed",
    "3",
]


@pytest.mark.usefixtures("local_env")
def test_eval_gsm8k_on_the_local_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "res" / "eval.json"
    assert main(["eval", "--benchmark", "gsm8k", *ARGS, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gsm8k" in printed
    assert "pass@1" in printed
    assert str(out) in printed
    local = _check_report(out, "local")
    # flags after the benchmark, and the chat-file NLL in the same run
    out2 = tmp_path / "eval2.json"
    argv = ["eval", "--output", str(out2), "--benchmark", "gsm8k", "nll", "--data", f"gsm8k={FIXTURE}"]
    argv += ["--limit", "4", "--num-samples", "2", "--max-tokens", "8", "--temperature", "1.0", "--seed", "3"]
    assert main(argv) == 0
    report = read_report(out2)
    again, nll = report["results"]
    assert again["items"] == local["items"], "the same seed repeats every sample"
    assert nll["kind"] == "nll"
    assert nll["conversations"] == 4
    assert nll["metrics"]["nll"] > 0
    assert nll["metrics"]["bits_per_byte"] > 0


def test_eval_gsm8k_against_tempering_serve(tmp_path: Path, local_root: Path) -> None:
    server = ServerProcess(tmp_path / "data", local_root, "--max-request-mb", "4").start()
    try:
        out = tmp_path / "eval.json"
        argv = ["eval", "--benchmark", "gsm8k", *ARGS, "--output", str(out)]
        assert main([*argv, "--base-url", server.url, "--api-key", API_KEY]) == 0
    finally:
        server.stop()
        collect_sdk_garbage()
    _check_report(out, "server")


def test_an_unknown_benchmark_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:  # tyro reports the config's error and exits with 2
        main(["eval", "--benchmark", "gsm9k", "--data", FIXTURE])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    text = " ".join(re.sub("[│╭╮╰╯─]", " ", captured.err + captured.out).split())
    known = "aime24, aime25, gpqa, gsm8k, ifeval, math500, mbpp, mmlu_pro, mmlu_redux, nll, supergpqa"
    assert f"unknown benchmark 'gsm9k'; known benchmarks: {known}" in text
    assert main(["eval", "--list"]) == 0
    assert capsys.readouterr().out.split() == [
        *("gsm8k", "math500", "aime24", "aime25", "ifeval", "mmlu_pro", "gpqa", "supergpqa"),
        *("mmlu_redux", "mbpp", "nll"),
    ]


def test_results_file_is_json_with_a_format(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"results": []}))
    with pytest.raises(ValueError, match="not a tempering eval results file"):
        read_report(bad)


@pytest.mark.usefixtures("local_env")
def test_eval_runs_the_graded_benchmarks_on_the_local_engine(tmp_path: Path) -> None:
    fixtures = Path(FIXTURE).parent
    names = ("ifeval", "mmlu_pro", "gpqa", "supergpqa", "mmlu_redux", "mbpp")
    out = tmp_path / "eval.json"
    argv = ["eval", "--output", str(out), "--benchmark", *names, "--data"]
    argv += [f"{n}={fixtures / (n + '.jsonl')}" for n in names]
    argv += ["--limit", "2", "--max-tokens", "8", "--temperature", "1.0", "--grader-timeout-s", "3"]
    assert main(argv) == 0
    results = {r["benchmark"]: r for r in read_report(out)["results"]}
    assert set(results) == set(names)
    for name in names:
        metrics = results[name]["metrics"]
        assert results[name]["n_items"] == (1 if name == "supergpqa" else 2)
        assert 0.0 <= metrics["pass@1"] <= 1.0
        assert ("partial_credit" in metrics) is (name in ("ifeval", "mbpp"))
