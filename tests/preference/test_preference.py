"""DPO raises held-out preference accuracy and keeps its reference across resumes; the reward
model beats chance on held-out pairs, trained through the public CLI."""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path

import pytest
import torch

from tempering import cli
from tempering.local import CheckpointStore, ServiceClient
from tempering.preference import (
    ComparisonData,
    DPOConfig,
    PreferenceModel,
    RewardModelConfig,
    VerdictPreferenceModel,
)
from tempering.training import AdamConfig, RunConfig, RunDir
from tempering_protocols import Comparison, Message


def _dpo(log_dir: Path, steps: int, save_every: int = 0) -> DPOConfig:
    return DPOConfig(
        run=RunConfig(log_dir=str(log_dir), save_every=save_every, eval_every=0, progress=False),
        data=ComparisonData(batch_size=4, test_size=24),
        adam=AdamConfig(learning_rate=2e-3),
        beta=0.1,
        max_steps=steps,
    )


def test_dpo_raises_held_out_preference_accuracy(tmp_path: Path, service: ServiceClient) -> None:
    result = asyncio.run(_dpo(tmp_path / "run", 10)(service))
    first, last = result.metrics[0], result.metrics[-1]
    assert first["initial/test/dpo_accuracy"] == 0.5  # the policy is its own reference
    assert first["initial/test/dpo_loss"] == pytest.approx(0.6931, abs=1e-3)
    assert last["test/dpo_accuracy"] > 0.65
    assert last["test/dpo_loss"] < 0.6
    assert last["test/policy_accuracy"] >= first["initial/test/policy_accuracy"]
    for key in ("loss", "dpo/accuracy", "dpo/chosen_reward", "dpo/rejected_reward", "dpo/margin"):
        assert key in last
    assert pickle.loads(pickle.dumps(_dpo(tmp_path, 1))) == _dpo(tmp_path, 1)


def test_dpo_reference_stays_the_initial_policy_across_resume(
    tmp_path: Path, tempering_home: Path, service: ServiceClient
) -> None:
    """Cut a finished run back to its step-3 checkpoint (as a crash after it would leave it) and
    resume: the same reference path, the same metrics, the same final weights."""
    log_dir = tmp_path / "run"
    full = asyncio.run(_dpo(log_dir, 6, save_every=3)(service))
    run = RunDir(log_dir)
    reference = run.read_state()["reference_path"]
    first = run.checkpoints()[0]
    assert first.step == 3
    run.index_path.write_text(json.dumps(first.to_json()) + "\n")
    with run.metrics_path.open("a") as f:
        f.write('{"step": 6, "loss": 0.1')  # a torn line
    resumed = asyncio.run(_dpo(log_dir, 6, save_every=3)(service))
    assert run.read_state()["reference_path"] == reference
    assert [m["step"] for m in resumed.metrics] == list(range(6))
    for got, want in zip(resumed.metrics, full.metrics, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-6)
    store = CheckpointStore(tempering_home)
    got_w, want_w = store.load(resumed.final.state_path).weights, store.load(full.final.state_path).weights
    for name, tensor in want_w.items():
        torch.testing.assert_close(got_w[name], tensor, rtol=1e-5, atol=1e-6)


def test_reward_model_beats_chance_through_the_cli(
    tmp_path: Path, tempering_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TEMPERING_HOME", str(tempering_home))
    monkeypatch.setenv("TEMPERING_NUM_THREADS", "1")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    log_dir = tmp_path / "rm"
    args = [
        "rm",
        f"--run.log-dir={log_dir}",
        "--run.no-progress",
        "--run.eval-every=0",
        "--run.save-every=0",
        "--data.batch-size=4",
        "--data.test-size=40",
        "--adam.learning-rate=3e-3",
        "--max-steps=24",
    ]
    assert cli.main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["test/pref_accuracy"] > 0.6
    assert summary["sampler"] is not None
    # The trained model as a PreferenceModel, e.g. for an RL reward.
    config = RewardModelConfig(run=RunConfig(log_dir=str(log_dir)))
    with ServiceClient(root=tempering_home, device="cpu", dtype="float32", num_threads=1) as service:
        model = asyncio.run(VerdictPreferenceModel.load(summary["sampler"], config.model, service))
        assert isinstance(model, PreferenceModel)
        prompt: list[Message] = [{"role": "user", "content": "What is 2 + 3?"}]
        right: list[Message] = [{"role": "assistant", "content": "5"}]
        rambling: list[Message] = [
            {"role": "assistant", "content": "Let me think about this carefully. It is probably 5."}
        ]
        p_right = asyncio.run(model(Comparison(prompt, right, rambling)))
        p_swapped = asyncio.run(model(Comparison(prompt, rambling, right)))
    assert 0.0 < p_right < 1.0
    assert p_right == pytest.approx(1.0 - p_swapped, abs=1e-6)  # symmetric by construction


def test_cli_help_lists_trainers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for name in ("sft", "dpo", "rm", "demo", "tiny-model"):
        assert name in out
    with pytest.raises(SystemExit):
        cli.main(["dpo", "--help"])
    assert "--beta" in capsys.readouterr().out
