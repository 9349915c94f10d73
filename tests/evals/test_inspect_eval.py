"""Any inspect-ai task as a periodic evaluation of a run (``inspect:SPEC`` in the suite).

The tasks are written here (a memory dataset of a few samples, ``generate()``, the ``match()``
scorer) and run on the built-in tiny model. The tiny model writes noise, so a sample the model
must get right is made from what it will write: sampled directly with the seed the evaluator's
provider derives for that prompt. The other samples have targets the model cannot write.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker

pytest.importorskip("inspect_ai")

from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.log import read_eval_log
from inspect_ai.scorer import match
from inspect_ai.solver import generate

from tempering.backend import ModelConfig, load_tokenizer
from tempering.cli import _tyro_cli, main
from tempering.cli.eval import EvalCommandConfig, run_eval
from tempering.envs.tasks import LowercaseTask
from tempering.evals.inspect_eval import (
    InspectEvaluator,
    InspectTaskError,
    InspectUnavailableError,
    UnknownInspectTaskError,
    load_inspect_tasks,
    parse_task_args,
)
from tempering.evals.inspect_model import request_seed
from tempering.evals.report import read_report
from tempering.evals.stats import item_seed, wilson_interval
from tempering.evals.suite import EvalSuite
from tempering.local import ServiceClient
from tempering.preference import ComparisonData, DPOConfig
from tempering.renderers import get_renderer
from tempering.rl.train import RLConfig
from tempering.sft import ChatData, SFTConfig
from tempering.training import RunConfig
from tempering_protocols import Renderer, SamplingClient

pytestmark = [
    pytest.mark.timeout(300),
    # inspect 0.3's retry config uses a tenacity argument tenacity deprecates
    pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Unclosed <MemoryObject:ResourceWarning"),
]

IMPOSSIBLE = "this-is-not-a-reply-of-the-tiny-model"

TASKS_PY = textwrap.dedent(
    f"""
    from inspect_ai import Task, task
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate, solver


    @task
    def add_one(n: int = 3):
        samples = [Sample(input=f"What is {{i}}+1?", target="{IMPOSSIBLE}", id=i) for i in range(n)]
        return Task(dataset=MemoryDataset(samples), solver=generate(), scorer=match())


    @task
    def unbuildable():
        raise RuntimeError("the dataset is missing")


    @solver
    def explode():
        async def solve(state, generate):
            raise ValueError("the solver exploded")

        return solve


    @task
    def exploding():
        samples = [Sample(input="What is 1+1?", target="2")]
        return Task(dataset=MemoryDataset(samples), solver=explode(), scorer=match())
    """
)


@pytest.fixture(scope="module", autouse=True)
def _collect_inspect_garbage() -> Iterator[None]:
    """inspect leaves anyio memory streams unclosed; collect them here, where their
    ``ResourceWarning`` is ignored, so it cannot fire in another test or at the session's end."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def tasks_py(tmp_path: Path) -> Path:
    path = tmp_path / "my_tasks.py"
    path.write_text(TASKS_PY, encoding="utf-8")
    return path


@pytest.fixture
def renderer() -> Renderer:
    return get_renderer("chatml", load_tokenizer("tempering/tiny"))


def _reply(sampler: SamplingClient, renderer: Renderer, question: str, seed: int, max_tokens: int) -> str:
    """What the provider's first request of ``question`` returns (temperature 1)."""
    prompt = renderer.build_generation_prompt([{"role": "user", "content": question}])
    params = tinker.SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0,
        top_p=1.0,
        stop=renderer.get_stop_sequences(),
        seed=request_seed(seed, prompt.to_ints(), 0),
    )
    (sequence,) = sampler.sample(prompt, 1, params).result().sequences
    return renderer.parse_response(sequence.tokens)[0]["content"]


def test_scores_metrics_and_wilson_interval_of_a_task(
    service: ServiceClient, renderer: Renderer, tmp_path: Path
) -> None:
    sampler = service.create_sampling_client(base_model="tempering/tiny").result()
    seed = item_seed(5, "inspect", "echo")  # the provider's seed of task "echo" at evaluation seed 5
    expected = _reply(sampler, renderer, "Say something.", seed, max_tokens=8).strip()
    assert expected
    samples = [Sample(input="Say something.", target=expected, id="echo")]
    samples += [Sample(input=f"What is {i}+2?", target=IMPOSSIBLE, id=f"x{i}") for i in range(3)]
    task = Task(
        dataset=MemoryDataset(samples), solver=generate(), scorer=match(location="exact"), name="echo"
    )
    evaluator = InspectEvaluator(
        [task], base_model="tempering/tiny", renderer=renderer, log_dir=str(tmp_path / "logs"),
        temperature=1.0, max_tokens=8, seed=5,
    )  # fmt: skip
    metrics = asyncio.run(evaluator(sampler))
    assert metrics["inspect/echo/match/accuracy"] == pytest.approx(0.25)
    low, high = wilson_interval(1, 4)
    assert metrics["inspect/echo/match/accuracy_ci_low"] == pytest.approx(low)
    assert metrics["inspect/echo/match/accuracy_ci_high"] == pytest.approx(high)
    assert metrics["inspect/echo/match/stderr"] == pytest.approx(
        0.25
    )  # sd (ddof 1) of (1,0,0,0) = 0.5, over sqrt(4)
    assert metrics["inspect/echo/samples"] == 4
    (log,) = evaluator.logs
    assert log.eval.model == "tempering/tempering/tiny"
    assert Path(log.location).parent == tmp_path / "logs"
    # a second evaluation repeats every seed: the same replies, the same scores
    assert asyncio.run(evaluator(sampler)) == metrics
    first, second = (read_eval_log(entry.location) for entry in evaluator.logs)
    assert first.samples is not None
    assert second.samples is not None
    assert [s.output.completion for s in first.samples] == [s.output.completion for s in second.samples]
    # the samples of one prompt do not share a stream: three epochs of "echo" are not all the same
    evaluator.num_samples = 3
    epochs = asyncio.run(evaluator(sampler))
    replies = {
        s.output.completion
        for s in read_eval_log(evaluator.logs[-1].location).samples or []
        if s.id == "echo"
    }
    assert len(replies) > 1
    # with epochs reduced by their mean, the interval counts every reply (4 samples x 3 epochs)
    accuracy = epochs["inspect/echo/match/accuracy"]
    assert epochs["inspect/echo/match/accuracy_ci_low"] == pytest.approx(
        wilson_interval(accuracy * 12, 12)[0]
    )
    index = [json.loads(line) for line in (tmp_path / "logs" / "evaluations.jsonl").read_text().splitlines()]
    assert [(e["evaluation"], e["task"]) for e in index] == [(0, "echo"), (1, "echo"), (2, "echo")]
    assert index[0]["metrics"]["match/accuracy"] == pytest.approx(0.25)
    # a new evaluator on the same folder (a resumed run) goes on numbering; a torn line is skipped
    with (tmp_path / "logs" / "evaluations.jsonl").open("a") as f:
        f.write('{"evaluation": 9, "ta')
    resumed = InspectEvaluator(
        [task], base_model="tempering/tiny", renderer=renderer, log_dir=str(tmp_path / "logs")
    )
    asyncio.run(resumed(sampler))
    lines = (tmp_path / "logs" / "evaluations.jsonl").read_text().splitlines()
    assert lines[-2] == '{"evaluation": 9, "ta'
    assert json.loads(lines[-1])["evaluation"] == 3


def test_sft_runs_an_inspect_task_every_eval_every_steps(
    tmp_path: Path, service: ServiceClient, renderer: Renderer, tasks_py: Path
) -> None:
    run_dir = tmp_path / "sft"
    suite = EvalSuite(
        benchmarks=(f"inspect:{tasks_py}@add_one", "nll"), limit=2, max_tokens=6, temperature=1.0
    )
    config = SFTConfig(
        run=RunConfig(log_dir=str(run_dir), save_every=0, eval_every=2, progress=False),
        data=ChatData(batch_size=4),
        max_steps=3,
        evals=suite,
    )
    result = asyncio.run(config(service))
    metrics = result.metrics
    assert metrics[0]["initial/inspect/add_one/match/accuracy"] == 0.0
    assert metrics[0]["initial/inspect/add_one/samples"] == 2  # the suite's limit
    assert [
        ("inspect/add_one/match/accuracy" in m, "inspect/add_one/match/stderr" in m) for m in metrics
    ] == [
        (False, False),
        (True, True),
        (True, True),
    ]
    assert metrics[-1]["inspect/add_one/match/accuracy_ci_high"] == pytest.approx(wilson_interval(0, 2)[1])
    # the metrics reach the run's metrics.jsonl, the logs its inspect/ folder
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum("inspect/add_one/match/accuracy" in line for line in lines) == 2
    index = [
        json.loads(line) for line in (run_dir / "inspect" / "evaluations.jsonl").read_text().splitlines()
    ]
    assert [e["evaluation"] for e in index] == [0, 1, 2]
    assert all((run_dir / "inspect" / e["log"]).is_file() for e in index)
    # the last evaluation sampled the run's final weights, with the provider's seeds
    log = read_eval_log(str(run_dir / "inspect" / index[-1]["log"]))
    assert log.samples is not None
    by_id = {s.id: s for s in log.samples}
    assert result.final.sampler_path is not None
    final = service.create_sampling_client(model_path=result.final.sampler_path).result()
    seed = item_seed(0, "inspect", "add_one")
    assert by_id[0].output.completion == _reply(final, renderer, "What is 0+1?", seed, max_tokens=6)
    initial = read_eval_log(str(run_dir / "inspect" / index[0]["log"]))
    assert initial.samples is not None
    assert [s.output.completion for s in initial.samples] != [s.output.completion for s in log.samples]


def test_a_task_that_raises_during_the_run_stops_it_naming_task_and_log(
    tmp_path: Path, service: ServiceClient, tasks_py: Path
) -> None:
    config = SFTConfig(
        run=RunConfig(log_dir=str(tmp_path / "sft"), save_every=0, eval_every=2, progress=False),
        data=ChatData(batch_size=4),
        max_steps=2,
        evals=EvalSuite(benchmarks=(f"inspect:{tasks_py}@exploding",), max_tokens=4),
    )
    with pytest.raises(InspectTaskError, match=r"'exploding'.*the solver exploded.*its log: .*\.eval"):
        asyncio.run(config(service))


def test_bad_task_specs_are_named_when_the_suite_is_built(tasks_py: Path) -> None:
    model = ModelConfig()
    with pytest.raises(UnknownInspectTaskError, match=r"'no_such_task_anywhere': no such task; give"):
        EvalSuite(benchmarks=("inspect:no_such_task_anywhere",)).build(model)
    with pytest.raises(UnknownInspectTaskError, match=r"Task named 'nope' not found"):
        EvalSuite(benchmarks=(f"inspect:{tasks_py}@nope",)).build(model)
    with pytest.raises(UnknownInspectTaskError, match=r"no such file .*missing\.py"):
        EvalSuite(benchmarks=(f"inspect:{tasks_py.parent / 'missing.py'}@x",)).build(model)
    with pytest.raises(
        InspectTaskError, match=r"raised while being built: RuntimeError: the dataset is missing"
    ):
        EvalSuite(benchmarks=(f"inspect:{tasks_py}@unbuildable",)).build(model)
    with pytest.raises(UnknownInspectTaskError, match=r"give the inspect task after 'inspect:'"):
        EvalSuite(benchmarks=("inspect:",))
    with pytest.raises(ValueError, match=r"is an inspect task, which reads its own dataset"):
        EvalSuite(benchmarks=(f"inspect:{tasks_py}@add_one",), data=("x.jsonl",))
    twice = (f"inspect:{tasks_py}@add_one",) * 2
    with pytest.raises(ValueError, match=r"inspect task 'add_one' of .* is already run by"):
        EvalSuite(benchmarks=twice).build(model)
    # a whole file (every task in it), also by an absolute path
    both = tasks_py.parent / "two_tasks.py"
    both.write_text(
        TASKS_PY.split("@task\ndef unbuildable")[0]
        + TASKS_PY.replace("add_one", "add_two").split("@task\ndef unbuildable")[0]
    )
    (evaluator,) = EvalSuite(benchmarks=(f"inspect:{both}",)).build(model)
    assert isinstance(evaluator, InspectEvaluator)
    assert sorted(t.name for t in evaluator.tasks) == ["add_one", "add_two"]


@pytest.mark.usefixtures("local_env")
def test_the_cli_names_a_bad_or_failing_task_in_one_line(
    tmp_path: Path, tasks_py: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    argv = ["sft", "--run.log-dir", str(run_dir), "--max-steps", "1", "--data.batch-size", "2"]
    assert main([*argv, "--evals.benchmarks", "inspect:no_such_task_anywhere"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tempering sft: inspect task 'no_such_task_anywhere': no such task; give")
    assert "Traceback" not in err
    assert not run_dir.exists(), "refused before the run directory is made"
    assert (
        main([*argv, "--evals.benchmarks", f"inspect:{tasks_py}@exploding", "--evals.max-tokens", "4"]) == 1
    )
    err = capsys.readouterr().err
    assert err.startswith("tempering sft: inspect task 'exploding': the evaluation ended with status 'error'")
    assert "the solver exploded" in err
    assert str(run_dir / "inspect") in err
    assert "Traceback" not in err
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "inspect_ai", None)  # inspect-ai not installed
        code = main(["sft", "--run.log-dir", str(tmp_path / "bare"), "--evals.benchmarks", "inspect:add_one"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(
        "tempering sft: benchmark 'inspect:add_one' needs inspect-ai, which is not installed"
    )
    assert "pip install 'tempering[eval]'" in err
    assert "Traceback" not in err


def test_task_arguments_are_given_to_the_task_functions_and_checked(tasks_py: Path) -> None:
    model = ModelConfig()
    spec = f"inspect:{tasks_py}@add_one"
    (evaluator,) = EvalSuite(benchmarks=(spec,), inspect_args=("n=2",)).build(model)
    assert isinstance(evaluator, InspectEvaluator)
    assert len(evaluator.tasks[0].dataset) == 2
    assert parse_task_args(["n=2", "name=abc", "x=[1, 2]", 'y="5"', "z=true"]) == {
        "n": 2, "name": "abc", "x": [1, 2], "y": "5", "z": True
    }  # fmt: skip
    with pytest.raises(
        ValueError, match=r"\['colour'\]: not a parameter of any inspect task run \('add_one'\)"
    ):
        EvalSuite(benchmarks=(spec,), inspect_args=("colour=red",)).build(model)
    with pytest.raises(ValueError, match=r"inspect task argument 'n': give KEY=VALUE"):
        EvalSuite(benchmarks=(spec,), inspect_args=("n",))
    with pytest.raises(ValueError, match=r"no inspect task \(inspect:TASK\) is run"):
        EvalSuite(benchmarks=("nll",), inspect_args=("n=2",))
    with pytest.raises(InspectTaskError, match=r"raised while being built: TypeError"):
        EvalSuite(benchmarks=(spec,), inspect_args=("n=two",)).build(model)


def test_a_registered_task_function_is_found_by_name(tasks_py: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tasks_py.parent))
    monkeypatch.delitem(sys.modules, "my_tasks", raising=False)
    __import__("my_tasks")  # a @task function is registered when its module is imported
    (task,) = load_inspect_tasks("add_one")
    assert task.name == "add_one"
    assert len(task.dataset) == 3


def test_without_inspect_the_suite_names_the_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "inspect_ai", None)  # import inspect_ai now raises ImportError
    with pytest.raises(InspectUnavailableError, match=r"'inspect:my_task'.*pip install 'tempering\[eval\]'"):
        EvalSuite(benchmarks=("inspect:my_task",))
    assert EvalSuite(benchmarks=("nll",)).benchmarks == ("nll",)  # other benchmarks need no inspect


def test_the_inspect_task_comes_from_the_sft_flags(tasks_py: Path) -> None:
    spec = f"inspect:{tasks_py}@add_one"
    argv = ["--run.log-dir", "r", "--evals.benchmarks", spec, "nll", "--evals.limit", "5"]
    config = _tyro_cli(SFTConfig, [*argv, "--evals.inspect-args", "n=2"], "tempering sft", "sft")
    assert config.evals == EvalSuite(benchmarks=(spec, "nll"), limit=5, inspect_args=("n=2",))


@pytest.fixture
def local_env(monkeypatch: pytest.MonkeyPatch, local_root: Path) -> None:
    """The CLI's service is the local engine on the test store."""
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    for key, value in (
        ("TEMPERING_HOME", str(local_root)),
        ("TEMPERING_DEVICE", "cpu"),
        ("TEMPERING_DTYPE", "float32"),
        ("TEMPERING_NUM_THREADS", "1"),
    ):
        monkeypatch.setenv(key, value)


@pytest.mark.usefixtures("local_env")
def test_tempering_eval_runs_an_inspect_task(tmp_path: Path, tasks_py: Path) -> None:
    output = tmp_path / "out" / "e.json"
    command = EvalCommandConfig(
        benchmarks=(f"inspect:{tasks_py}@add_one", "nll"), limit=2, max_tokens=4, output=str(output)
    )
    metrics = asyncio.run(run_eval(command))
    assert metrics["inspect/add_one/match/accuracy"] == 0.0
    assert "nll/nll" in metrics
    report = read_report(output)
    (inspect_result,) = [r for r in report["results"] if r["kind"] == "inspect"]
    assert inspect_result["benchmark"] == "inspect:add_one"
    assert inspect_result["metrics"]["samples"] == 2
    assert Path(inspect_result["log"]).parent == output.parent / "inspect"
    assert Path(inspect_result["log"]).is_file()


def test_rl_and_dpo_run_an_inspect_task_and_log_it_in_their_run_dir(
    tmp_path: Path, service: ServiceClient, tasks_py: Path
) -> None:
    suite = EvalSuite(benchmarks=(f"inspect:{tasks_py}@add_one",), limit=1, max_tokens=4)
    rl = RLConfig(
        run=RunConfig(log_dir=str(tmp_path / "rl"), save_every=0, eval_every=1, progress=False),
        dataset=LowercaseTask(batch_size=2, group_size=2),
        num_steps=2,
        max_tokens=4,
        evals=suite,
    )
    rl_metrics = asyncio.run(rl(service)).metrics
    assert [m["inspect/add_one/samples"] for m in rl_metrics] == [1, 1]
    assert len(list((tmp_path / "rl" / "inspect").glob("*.eval"))) == 2
    dpo = DPOConfig(
        run=RunConfig(log_dir=str(tmp_path / "dpo"), save_every=0, eval_every=0, progress=False),
        data=ComparisonData(batch_size=4, test_size=4),
        max_steps=1,
        evals=suite,
    )
    dpo_metrics = asyncio.run(dpo(service)).metrics
    assert dpo_metrics[0]["initial/inspect/add_one/match/accuracy"] == 0.0
    assert "test/dpo_accuracy" in dpo_metrics[-1]  # the held-out pairs still run beside it
    assert dpo_metrics[-1]["inspect/add_one/match/accuracy_ci_high"] == pytest.approx(
        wilson_interval(0, 1)[1]
    )
    assert len(list((tmp_path / "dpo" / "inspect").glob("*.eval"))) == 2
