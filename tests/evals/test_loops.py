"""The SFT and RL loops run a benchmark suite every ``eval_every`` steps (``evals`` field), also
from the command line's flags."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tempering.cli import _tyro_cli
from tempering.cli.eval import EvalCommandConfig, run_eval
from tempering.cli.rl import RLCommandConfig
from tempering.envs.tasks import LowercaseTask
from tempering.evals.suite import EvalSuite
from tempering.local import ServiceClient
from tempering.rl.train import RLConfig
from tempering.sft import ChatData, SFTConfig
from tempering.training import RunConfig

FIXTURE = str(Path(__file__).parent / "fixtures" / "gsm8k.jsonl")
SUITE = EvalSuite(
    benchmarks=("gsm8k", "nll"), data=(f"gsm8k={FIXTURE}",), limit=2, max_tokens=4, num_samples=2
)
pytestmark = pytest.mark.timeout(300)


def test_sft_runs_the_suite_before_every_eval_every_steps_and_after(
    tmp_path: Path, service: ServiceClient, local_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = SFTConfig(
        run=RunConfig(log_dir=str(tmp_path / "sft"), save_every=0, eval_every=2, progress=False),
        data=ChatData(batch_size=4),
        max_steps=3,
        evals=SUITE,
    )
    result = asyncio.run(config(service))
    metrics = result.metrics
    assert "initial/gsm8k/pass@1" in metrics[0]
    assert "initial/nll/bits_per_byte" in metrics[0]
    assert [("gsm8k/pass@1" in m, "nll/nll" in m) for m in metrics] == [
        (False, False),
        (True, True),
        (True, True),
    ]
    # training lowers the chat-file NLL the suite measures (the sampler follows the trainer)
    assert metrics[-1]["nll/nll"] < metrics[0]["initial/nll/nll"]
    assert 0.0 <= metrics[-1]["gsm8k/pass@1"] <= 1.0
    # tempering eval on the run's final checkpoint (a tempering:// path) measures the same NLL
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    for key, value in (
        ("TEMPERING_HOME", str(local_root)),
        ("TEMPERING_DEVICE", "cpu"),
        ("TEMPERING_NUM_THREADS", "1"),
    ):
        monkeypatch.setenv(key, value)
    assert result.final.sampler_path is not None
    assert result.final.sampler_path.startswith("tempering://")
    command = EvalCommandConfig(
        benchmarks=("nll",), limit=2, model_path=result.final.sampler_path, output=str(tmp_path / "e.json")
    )
    evaluated = asyncio.run(run_eval(command))
    assert evaluated["nll/nll"] == pytest.approx(metrics[-1]["nll/nll"], rel=1e-4)
    assert evaluated["nll/nll"] != pytest.approx(metrics[0]["initial/nll/nll"], rel=1e-2)


def test_rl_runs_the_suite_every_eval_every_steps(tmp_path: Path, service: ServiceClient) -> None:
    config = RLConfig(
        run=RunConfig(log_dir=str(tmp_path / "rl"), save_every=0, eval_every=1, progress=False),
        dataset=LowercaseTask(batch_size=2, group_size=2),
        num_steps=2,
        max_tokens=4,
        evals=SUITE,
    )
    metrics = asyncio.run(config(service)).metrics
    assert len(metrics) == 2
    for m in metrics:
        assert {"gsm8k/pass@1", "gsm8k/pass@1_ci_high", "nll/bits_per_byte", "time/eval"} <= set(m)


def test_the_suite_comes_from_flags() -> None:
    argv = [
        "--run.log-dir",
        "r",
        "--evals.benchmarks",
        "gsm8k",
        "--evals.limit",
        "5",
        "--evals.data",
        FIXTURE,
    ]
    config = _tyro_cli(RLCommandConfig, argv, "tempering rl", "rl")
    assert config.evals == EvalSuite(benchmarks=("gsm8k",), limit=5, data=(FIXTURE,))
