"""Exact resume under SIGKILL: a run killed at any point and resumed writes each step's metrics
line once, with the same data order, and ends with the weights of an uninterrupted run.

The killed runs go through the public CLI in a subprocess (``TEMPERING_TEST_KILL_AT`` makes it
SIGKILL itself at a chosen point, or the test kills it after seeing metrics lines); the resumes
and the uninterrupted reference run in this process through the public API.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tempering.local import CheckpointStore, ServiceClient
from tempering.sft import ChatData, SFTConfig
from tempering.training import TEST_KILL_ENV, RunConfig, RunDir

STEPS = 6


def _config(log_dir: Path) -> SFTConfig:
    return SFTConfig(
        run=RunConfig(log_dir=str(log_dir), save_every=2, eval_every=3, progress=False),
        data=ChatData(batch_size=4, test_path=None, test_size=8),
        max_steps=STEPS,
    )


def _cli_args(log_dir: Path) -> list[str]:
    return [
        "sft",
        f"--run.log-dir={log_dir}",
        "--run.save-every=2",
        "--run.eval-every=3",
        "--run.no-progress",
        "--data.batch-size=4",
        "--data.test-path=None",
        "--data.test-size=8",
        f"--max-steps={STEPS}",
    ]


def _env(home: Path, kill_at: str | None) -> dict[str, str]:
    env = {**os.environ, "TEMPERING_HOME": str(home), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    env.pop(TEST_KILL_ENV, None)
    if kill_at is not None:
        env[TEST_KILL_ENV] = kill_at
    return env


def _run_cli(home: Path, log_dir: Path, kill_at: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tempering.cli", *_cli_args(log_dir)],
        env=_env(home, kill_at),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _weights(home: Path, path: str) -> dict[str, torch.Tensor]:
    return CheckpointStore(home).load(path).weights


Reference = tuple[list[dict[str, Any]], str, Path]
"""The uninterrupted run: its metrics lines, final state path and log directory."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, service: ServiceClient) -> Reference:
    log_dir = tmp_path_factory.mktemp("reference") / "run"
    result = asyncio.run(_config(log_dir)(service))
    return result.metrics, result.final.state_path, log_dir


def _check_resumed(home: Path, service: ServiceClient, log_dir: Path, reference: Reference) -> None:
    ref_metrics, ref_path, _ = reference
    result = asyncio.run(_config(log_dir)(service))
    metrics = RunDir(log_dir).read_metrics()
    assert [m["step"] for m in metrics] == list(range(STEPS))
    for got, want in zip(metrics, ref_metrics, strict=True):
        assert got["tokens"] == want["tokens"]  # the same batches, in the same order
        assert got["lr"] == want["lr"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-6)
    meta = CheckpointStore(home).read_meta(result.final.state_path)
    assert meta.optimizer_steps == STEPS  # no step applied twice, none skipped
    got_w, want_w = _weights(home, result.final.state_path), _weights(home, ref_path)
    for name, tensor in want_w.items():
        torch.testing.assert_close(got_w[name], tensor, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "kill_at",
    [
        "before_index:1",  # the step-2 state is saved but not in the index: resume from 0
        "before_metrics:4",  # steps 0-4 applied, line 4 never written: resume from 4
        "after_index:3",  # the step-4 checkpoint is recorded: resume from 4
    ],
)
def test_sigkill_then_resume_matches_uninterrupted(
    kill_at: str,
    tmp_path: Path,
    tempering_home: Path,
    service: ServiceClient,
    reference: Reference,
) -> None:
    log_dir = tmp_path / "run"
    proc = _run_cli(tempering_home, log_dir, kill_at)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    point, step = kill_at.split(":")
    lines = RunDir(log_dir).read_metrics()
    written = int(step) if point == "before_metrics" else int(step) + 1
    assert [m["step"] for m in lines] == list(range(written))
    _check_resumed(tempering_home, service, log_dir, reference)


def test_external_sigkill_after_some_lines(
    tmp_path: Path,
    tempering_home: Path,
    service: ServiceClient,
    reference: Reference,
) -> None:
    log_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tempering.cli", *_cli_args(log_dir)],
        env=_env(tempering_home, None),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while len(RunDir(log_dir).read_metrics()) < 3 and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    _check_resumed(tempering_home, service, log_dir, reference)


def test_completed_run_resumes_to_nothing_and_refuse_refuses(
    tempering_home: Path, reference: Reference
) -> None:
    log_dir = reference[2]
    again = _run_cli(tempering_home, log_dir, None)
    assert again.returncode == 0, again.stderr[-2000:]
    assert RunDir(log_dir).read_metrics() == reference[0]  # nothing recomputed
    refused = subprocess.run(
        [sys.executable, "-m", "tempering.cli", *_cli_args(log_dir), "--run.if-exists=refuse"],
        env=_env(tempering_home, None),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert refused.returncode == 2
    assert "already holds a run" in refused.stderr
