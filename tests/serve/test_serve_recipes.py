"""Recipes and trainers on a Tinker-compatible server (``tempering serve``, the official SDK): a
recipe or ``tempering rl`` runs to its end and finishes its session there, and a recipe that
fails tells the server so.

Before, the recipes closed the SDK's ``ServiceClient`` as if it were the local engine's
(``close()`` without the status the SDK requires): every recipe on the hosted service failed
with a ``TypeError`` after its last step; and SFT's evaluations used the SDK's future of a
sampling client as the client, which blocks the event loop (the SDK warns of it)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import tinker

from tempering import assets
from tempering.recipes._common import recipe_session
from tempering.serve.testing import API_KEY, ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # the SDK's leak (conftest)


def _open_sessions(server: ServerProcess) -> int:
    return int(
        httpx.get(f"{server.url}/api/v1/healthz", headers={"X-API-Key": API_KEY}, timeout=10).json()[
            "sessions"
        ]
    )


def _log_lines(server: ServerProcess, text: str) -> list[str]:
    deadline = time.monotonic() + 10  # the log is pumped from the server's stdout by a thread
    while time.monotonic() < deadline:
        found = [line for line in server.log if text in line]
        if found:
            return found
        time.sleep(0.05)
    return []


def _hosted_env(server: ServerProcess, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "TINKER_API_KEY": API_KEY,
        "TINKER_BASE_URL": server.url,
        "TEMPERING_HOME": str(tmp_path / "home"),
        "TEMPERING_NUM_THREADS": "1",
    }


def test_chat_sft_runs_on_serve_and_finishes_its_session(
    server: ServerProcess, tiny_dir: Path, tmp_path: Path
) -> None:
    small = tmp_path / "chat_test_8.jsonl"
    small.write_text("".join(assets.path("arithmetic_chat_test.jsonl").read_text().splitlines(True)[:8]))
    out = tmp_path / "run"
    before, log_start = _open_sessions(server), len(server.log)  # other tests share the server
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "chat-sft", "--base-model", str(tiny_dir),
         "--steps", "3", "--batch-size", "4", "--eval-every", "0", "--show", "1", "--no-progress",
         "--test-path", str(small), "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=_hosted_env(server, tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "chat-sft"
    assert summary["sft_sampler_path"].startswith("tinker://")  # trained and saved on the server
    assert _open_sessions(server) == before  # the recipe's session was finished, not left to expire
    # the evaluations await the SDK's future of a sampling client instead of blocking the loop on it
    assert "sync from async" not in proc.stderr.lower(), proc.stderr[-4000:]
    assert not any("finished by its client: errored" in line for line in server.log[log_start:])


def test_rl_runs_on_serve_and_finishes_its_session(
    server: ServerProcess, tiny_dir: Path, tmp_path: Path
) -> None:
    log_dir = tmp_path / "rl"
    before = _open_sessions(server)
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "rl", "--run.log-dir", str(log_dir), "--num-steps", "2",
         "--max-tokens", "4", "--model.base-model", str(tiny_dir), "--model.lora-rank", "4",
         "dataset:lowercase-task", "--dataset.batch-size", "2",
         "--dataset.group-size", "2"],
        capture_output=True, text=True, timeout=300, env=_hosted_env(server, tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = [json.loads(x)["step"] for x in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]
    assert _open_sessions(server) == before  # the trainer finished the session of the service it made
    # each step's sampler is the SDK's future, awaited; used as the client it would block the loop
    assert "sync from async" not in proc.stderr.lower(), proc.stderr[-4000:]


def test_a_failing_recipe_finishes_its_session_as_errored(
    server: ServerProcess, tiny_dir: Path, tmp_path: Path
) -> None:
    before = _open_sessions(server)
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    config = SimpleNamespace(out=str(tmp_path / "run"), progress=False)

    async def go() -> None:
        async with recipe_session("failing", config, service=service) as s:
            await s.service.create_sampling_client(base_model=str(tiny_dir))
            assert _open_sessions(server) == before + 1
            raise RuntimeError("the recipe's own error")

    with pytest.raises(RuntimeError, match="the recipe's own error"):  # not hidden by the close
        asyncio.run(go())
    assert _log_lines(server, "finished by its client: errored")
    assert _open_sessions(server) == before
    assert (tmp_path / "run").is_dir()  # what the recipe had written stays


def test_topk_distill_runs_on_serve(server: ServerProcess, tiny_dir: Path, tmp_path: Path) -> None:
    """The teacher's top-K comes through the official SDK's ``topk_prompt_logprobs`` (issue 29)."""
    small = tmp_path / "chat_test_8.jsonl"
    small.write_text("".join(assets.path("arithmetic_chat_test.jsonl").read_text().splitlines(True)[:8]))
    out = tmp_path / "run"
    before = _open_sessions(server)
    proc = subprocess.run(
        [sys.executable, "-m", "tempering.cli", "recipe", "topk-distill", "--base-model", str(tiny_dir),
         "--lora-rank", "4", "--n-train", "16", "--teacher-steps", "2", "--teacher-batch-size", "4",
         "--steps", "3", "--batch-size", "4", "--k", "4", "--n-test", "4", "--max-tokens", "4",
         "--no-compare-sft", "--no-progress", "--test-path", str(small), "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=_hosted_env(server, tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["teacher_path"].startswith("tinker://")
    assert summary["topk_nll_before"] > 0
    assert summary["topk_nll_after"] > 0
    assert _open_sessions(server) == before
