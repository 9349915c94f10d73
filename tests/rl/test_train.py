"""The RL loop on the local engine: each schedule raises a verifiable reward, losses and the
KL/distillation terms run, self-play trains through a group, and a SIGKILLed run resumes
exactly (every step's metrics once, no optimizer step repeated or lost)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np
import pytest

from tempering.envs import NimGroupBuilder
from tempering.envs.tasks import LowercaseTask
from tempering.local import ServiceClient
from tempering.renderers import get_renderer
from tempering.rl.data import compute_advantages, strip_loss_inputs, trajectories_to_datums
from tempering.rl.policy import TinkerTokenCompleter
from tempering.rl.rollouts import RolloutConfig, rollout_group
from tempering.rl.train import RLConfig, train
from tempering.training import TEST_KILL_ENV, AdamConfig, LRSchedule, ModelConfig, RunConfig
from tempering.training.loop import load_tokenizer
from tempering_protocols import EnvGroupBuilder, RLDataset

HERE = Path(__file__).parent


def _config(log_dir: Path, **kw: object) -> RLConfig:
    base: dict[str, object] = {
        "run": RunConfig(log_dir=str(log_dir), save_every=0, eval_every=4, progress=False),
        "dataset": LowercaseTask(batch_size=4, group_size=8),
        "model": ModelConfig(lora_rank=8),
        "adam": AdamConfig(learning_rate=2e-2, schedule=LRSchedule("constant")),
        "num_steps": 8,
        "max_tokens": 8,
    }
    base.update(kw)
    return RLConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("schedule", "substeps"), [("sync", 1), ("streaming", 2), ("async", 2)])
def test_each_schedule_raises_the_reward(
    schedule: str, substeps: int, service: ServiceClient, tmp_path: Path
) -> None:
    config = _config(tmp_path / schedule, schedule=schedule, num_substeps=substeps, max_steps_off_policy=1)
    result = asyncio.run(train(config, service=service))
    rewards = [float(m["env/reward/mean"]) for m in result.metrics]  # type: ignore[arg-type]
    assert len(rewards) == 8
    assert [m["step"] for m in result.metrics] == list(range(8))
    assert rewards[0] < 0.3, rewards
    assert np.mean(rewards[-2:]) > rewards[0] + 0.25, rewards
    last = result.metrics[-1]
    for key in (
        "kl/sample_train_v1",
        "entropy/sampled",
        "tokens/trained",
        "time/sampling",
        "test/reward/mean",
    ):
        assert key in result.metrics[3] or key in last, key
    if schedule == "async":
        assert all(float(m["async/mean_staleness"]) <= 1.0 for m in result.metrics)  # type: ignore[arg-type]
        assert all(float(m["async/max_staleness"]) <= 1.0 for m in result.metrics)  # type: ignore[arg-type]
    if schedule != "sync":
        assert max(float(m["optim/substeps"]) for m in result.metrics) == 2.0  # type: ignore[arg-type]
    assert result.final.sampler_path is not None


def test_losses_kl_penalty_and_distillation_run(service: ServiceClient, tmp_path: Path) -> None:
    first = asyncio.run(train(_config(tmp_path / "teacher", num_steps=2), service=service))
    for loss in ("ppo", "cispo", "dro"):
        config = _config(
            tmp_path / loss,
            num_steps=1,
            loss_fn=loss,
            kl_penalty_coef=0.1,
            distill_teacher=first.final.sampler_path,
            normalize_advantages=True,
            baseline="loo",
        )
        (line,) = asyncio.run(train(config, service=service)).metrics
        assert "kl/policy_base" in line, sorted(line)
        assert "distill/reverse_kl" in line, sorted(line)
        assert np.isfinite(float(line["optim/loss_sum"]))  # type: ignore[arg-type]


@attrs.frozen
class _NimDataset:
    builders: Sequence[EnvGroupBuilder]

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        return self.builders

    def __len__(self) -> int:
        return 3


@attrs.frozen
class NimTask:
    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        renderer = get_renderer("chatml", load_tokenizer("tempering/tiny"))
        return _NimDataset([NimGroupBuilder(renderer, pile=3, n_games=2, turn_timeout_s=30)]), None


def test_two_player_game_trains_through_a_group(service: ServiceClient, tmp_path: Path) -> None:
    client = service.create_lora_training_client("tempering/tiny", rank=4).result()
    renderer = get_renderer("chatml", load_tokenizer("tempering/tiny"))
    policy = TinkerTokenCompleter(client.save_weights_and_get_sampling_client(), max_tokens=4)
    rollout = asyncio.run(
        rollout_group(NimGroupBuilder(renderer, pile=3, n_games=4), policy, RolloutConfig())
    )
    assert rollout.group is not None
    assert rollout.failures == {}
    # Every game has a winner and a loser: +1 / -1 in each pair of members.
    finals = list(rollout.group.final_rewards_G)
    assert sorted(finals[0:2]) == [-1.0, 1.0]
    assert sorted(finals[2:4]) == [-1.0, 1.0]
    data, meta = trajectories_to_datums([rollout.group], compute_advantages([rollout.group]))
    assert {m["traj_idx"] for m in meta} == set(range(8))  # both sides of every game train
    client.forward_backward(strip_loss_inputs(data, "importance_sampling"), "importance_sampling").result()
    # And through the loop.
    result = asyncio.run(
        train(_config(tmp_path / "nim", dataset=NimTask(), num_steps=2, max_tokens=4), service=service)
    )
    assert [m["step"] for m in result.metrics] == [0, 1]
    assert all(float(m["tokens/trained"]) > 0 for m in result.metrics)  # type: ignore[arg-type]


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line]


def test_sigkill_then_resume_is_exact(local_root: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TEMPERING_NUM_THREADS": "1",
        "TEMPERING_HOME": str(local_root),
        "TEMPERING_DEVICE": "cpu",
    }
    env.pop("TINKER_API_KEY", None)
    log_dir = tmp_path / "run"
    cmd = [sys.executable, str(HERE / "rl_script.py"), str(log_dir), "sync"]
    killed = subprocess.run(
        cmd, env={**env, TEST_KILL_ENV: "before_metrics:3"}, capture_output=True, timeout=300
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert [line["step"] for line in _lines(log_dir)] == [0, 1, 2]
    index = [json.loads(x) for x in (log_dir / "checkpoints.jsonl").read_text().splitlines() if x]
    assert [r["step"] for r in index] == [2]
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    lines = _lines(log_dir)
    assert [line["step"] for line in lines] == list(range(6))  # every step once
    assert [line["batch"] for line in lines] == list(range(6))  # the same batches
    assert all(line["optim/substeps"] == 1.0 for line in lines)
    index = [json.loads(x) for x in (log_dir / "checkpoints.jsonl").read_text().splitlines() if x]
    assert [r["step"] for r in index] == [2, 4, 6]
    assert index[-1]["final"]
