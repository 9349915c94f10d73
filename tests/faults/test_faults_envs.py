"""Faults of envs and rollouts (issue 15, bugs 6, 7, 8 and the env cases of 12): every rollout
failing, timeouts with env workers, endless and hanging envs, empty groups, bad rewards, and
settings that cannot learn."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from faults_envs import MisbehavingGroup

from tempering.local import ServiceClient
from tempering.rl import RLConfig
from tempering.rl.executors import ProcessPoolExecutor
from tempering.rl.rollouts import (
    GroupRollout,
    RolloutConfig,
    RolloutsFailedError,
    raise_if_every_rollout_failed,
    rollout_batch,
    rollout_group,
    warn_if_nothing_to_learn,
)
from tempering.training import RunConfig
from tempering_protocols import (
    Env,
    Metrics,
    Observation,
    StopCondition,
    TokensWithLogprobs,
    Trajectory,
)


class Policy:
    """Answers one token then the stop token; or raises ``error`` (a sampler refusing)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    async def __call__(self, model_input: Observation, stop: StopCondition, /) -> TokensWithLogprobs:
        if self.error is not None:
            raise self.error
        return TokensWithLogprobs(tokens=[5, 0], maybe_logprobs=[-0.5, -0.5])


def _cli_env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "TEMPERING_HOME": str(tmp_path / "home"), "TEMPERING_NUM_THREADS": "1"}
    env.pop("TINKER_API_KEY", None)
    return env


# ------------------------------------------------------------------------------ bug 6


@pytest.mark.timeout(240)
def test_rl_where_every_rollout_fails_stops_with_the_first_error(tmp_path: Path) -> None:
    """Bug 6: ``tempering rl --temperature -1`` exited 0 having trained nothing, the error never
    shown. Now: exit 1 at step 0, naming the error and its message; the message logged once.
    (``--temperature -1`` itself is now refused as a flag before anything runs, issue 32; here
    every rollout fails because the env's rewards are NaN.)"""
    log_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tempering.cli",
            "rl",
            "--run.log-dir",
            str(log_dir),
            "--dataset-builder",
            "faults_envs:MisbehavingDatasetBuilder",
            "--dataset.mode",
            "nan",
            "--num-steps",
            "2",
            "--max-tokens",
            "4",
        ],
        env={**_cli_env(tmp_path), "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])},
        capture_output=True,
        text=True,
        timeout=220,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("tempering rl: step 0: every rollout failed"), proc.stderr[-3000:]
    assert "RewardError: 4" in last  # 2 groups x 2 members, counted by type
    assert "The first error: RewardError: MisbehavingEnv.step (turn 0) returned the reward nan" in last
    assert "Traceback" not in proc.stderr
    # The distinct message was logged once at WARNING, not once per rollout.
    warnings = [ln for ln in proc.stderr.splitlines() if "failed: RewardError:" in ln]
    assert len(warnings) == 1, warnings
    # Nothing half-written: the run directory holds its config, and no step was recorded.
    assert json.loads((log_dir / "config.json").read_text())
    metrics = log_dir / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text().strip() == ""


@pytest.mark.timeout(60)
def test_each_distinct_failure_message_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tempering.rl.rollouts")
    builders = [MisbehavingGroup("ok", group_size=3) for _ in range(3)]
    policy = Policy(ValueError("temperature must be >= 0, got -1 (sampler says so)"))
    out = asyncio.run(rollout_batch(builders, policy, RolloutConfig()))
    assert [r.failures for r in out] == [{"rollout/failed/ValueError": 3}] * 3
    logged = [r.getMessage() for r in caplog.records if "sampler says so" in r.getMessage()]
    assert len(logged) == 1, logged
    assert "ValueError: temperature must be >= 0" in logged[0]
    assert "rollout/failed/ValueError" in logged[0]
    pattern = r"step 7: every rollout failed \(3 group\(s\); ValueError: 9\)"
    with pytest.raises(RolloutsFailedError, match=pattern) as exc:
        raise_if_every_rollout_failed(out, step=7)
    assert isinstance(exc.value.__cause__, ValueError)
    assert "sampler says so" in str(exc.value)


def test_a_step_with_one_finished_group_goes_on() -> None:
    ok = asyncio.run(rollout_group(MisbehavingGroup("ok"), Policy(), RolloutConfig(), index=0))
    bad = asyncio.run(rollout_group(MisbehavingGroup("ok"), Policy(KeyError("x")), RolloutConfig(), index=1))
    assert ok.group is not None
    assert bad.group is None
    raise_if_every_rollout_failed([bad, ok], step=0)  # no error: something can be trained on
    raise_if_every_rollout_failed([], step=0)


# ------------------------------------------------------------------------------ bug 7


@pytest.mark.timeout(90)
def test_rollout_timeout_bounds_a_step_with_env_workers() -> None:
    """Bug 7: an env whose ``step`` blocks (``time.sleep(20)``) in a worker process, with
    ``rollout_timeout_s=1``: the step took the sum of every sleep (4 x 20 s here). Now the
    timeout cancels the call, the stuck worker is restarted, and the next group runs."""
    config = RolloutConfig(rollout_timeout_s=1.0)

    async def go() -> tuple[float, list[GroupRollout], GroupRollout]:
        with ProcessPoolExecutor(num_workers=1, cancel_grace_s=1.0) as pool:
            t0 = time.perf_counter()
            slow = [MisbehavingGroup("sleep", group_size=2, seconds=20.0) for _ in range(2)]
            out = await rollout_batch(slow, Policy(), config, executor=pool)
            elapsed = time.perf_counter() - t0
            await asyncio.sleep(1.5)  # the grace period: the stuck worker is replaced
            after = await rollout_group(MisbehavingGroup("ok"), Policy(), RolloutConfig(), executor=pool)
            return elapsed, out, after

    elapsed, out, after = asyncio.run(go())
    assert elapsed < 30, elapsed  # 80 s before the fix
    for r in out:
        assert r.group is None
        assert r.failures.get("rollout/failed/TimeoutError", 0) >= 2, r.failures
        assert isinstance(r.first_error, TimeoutError)
        assert "rollout_timeout_s" in str(r.first_error)
    assert after.group is not None
    assert after.failures == {}, after.failures


@pytest.mark.timeout(90)
def test_rollout_timeout_cancels_an_awaiting_env_in_a_worker() -> None:
    async def go() -> GroupRollout:
        with ProcessPoolExecutor(num_workers=1) as pool:
            return await rollout_group(
                MisbehavingGroup("hang-step"), Policy(), RolloutConfig(rollout_timeout_s=0.5), executor=pool
            )

    r = asyncio.run(go())
    assert r.failures == {"rollout/failed/TimeoutError": 2}


# ------------------------------------------------------------------------------ bug 8


def test_rollout_config_defaults_are_finite() -> None:
    config = RolloutConfig()
    assert config.max_turns == 64
    assert config.rollout_timeout_s == 600.0
    for bad in ({"max_turns": 0}, {"rollout_timeout_s": 0.0}, {"rollout_timeout_s": float("inf")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RolloutConfig(**bad)  # pyright: ignore[reportArgumentType]
    assert RolloutConfig(max_turns=None, rollout_timeout_s=None).max_turns is None  # opting out


@pytest.mark.timeout(60)
def test_an_env_that_never_finishes_ends_at_the_default_max_turns() -> None:
    """Bug 8: an env that never sets ``episode_done`` ran forever under ``RolloutConfig()``."""
    r = asyncio.run(rollout_group(MisbehavingGroup("endless"), Policy(), RolloutConfig()))
    assert r.group is not None
    assert list(r.end_reasons_G) == ["max_turns", "max_turns"]
    assert [len(t.transitions) for t in r.group.trajectories_G] == [64, 64]


@pytest.mark.timeout(60)
def test_an_env_that_awaits_forever_times_out(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tempering.rl.rollouts")
    r = asyncio.run(rollout_group(MisbehavingGroup("hang"), Policy(), RolloutConfig(rollout_timeout_s=0.3)))
    assert r.group is None
    assert r.failures == {"rollout/failed/TimeoutError": 2}
    assert any("timed out after 0.3 s (RolloutConfig.rollout_timeout_s)" in m for m in caplog.messages)


# ------------------------------------------------------------------------------ 12: envs


@pytest.mark.timeout(60)
def test_make_envs_returning_nothing_is_counted_and_warned(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tempering.rl.rollouts")
    r = asyncio.run(rollout_group(MisbehavingGroup("ok", empty=True), Policy(), RolloutConfig(), index=3))
    assert r.group is None
    assert r.n_members == 0
    assert r.failures == {"rollout/failed/EmptyGroupError": 1}
    assert any(
        "make_envs of group 3 failed: EmptyGroupError: make_envs of MisbehavingGroup returned no envs" in m
        for m in caplog.messages
    ), caplog.messages


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mode", "shown"), [("nan", "nan (float)"), ("str", "'1.0' (str)")])
def test_a_bad_reward_fails_that_rollout_not_the_run(mode: str, shown: str) -> None:
    good = asyncio.run(rollout_group(MisbehavingGroup("ok"), Policy(), RolloutConfig()))
    r = asyncio.run(rollout_group(MisbehavingGroup(mode), Policy(), RolloutConfig(min_group_fraction=0.0)))
    assert good.group is not None
    assert r.group is None
    assert r.failures == {"rollout/failed/RewardError": 2}
    assert f"MisbehavingEnv.step (turn 0) returned the reward {shown}" in str(r.first_error)


class _BadScores(MisbehavingGroup):
    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        return [(float("inf"), {}) for _ in trajectories_G]


@pytest.mark.timeout(60)
def test_a_non_finite_group_reward_fails_the_group() -> None:
    r = asyncio.run(rollout_group(_BadScores("ok"), Policy(), RolloutConfig()))
    assert r.group is None
    assert r.failures == {"rollout/failed/RewardError": 1}
    assert "_BadScores.compute_group_rewards returned the reward inf" in str(r.first_error)


def test_settings_that_cannot_learn_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tempering.rl.rollouts")
    assert warn_if_nothing_to_learn(64, 8) is None
    assert "max_tokens is 0" in (warn_if_nothing_to_learn(0, 8) or "")
    assert "group_size is 1" in (warn_if_nothing_to_learn(64, 1) or "")
    assert warn_if_nothing_to_learn(64, 1, teacher=True) is None  # distillation still learns
    assert len(caplog.messages) == 2


@pytest.mark.timeout(180)
def test_rl_with_group_size_one_warns_before_training(
    service: ServiceClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tempering.envs.tasks import LowercaseTask

    caplog.set_level(logging.WARNING, logger="tempering.rl.rollouts")
    config = RLConfig(
        run=RunConfig(log_dir=str(tmp_path / "rl"), progress=False),
        dataset=LowercaseTask(batch_size=2, group_size=1),
        num_steps=1,
        max_tokens=4,
    )
    result = asyncio.run(config(service=service))
    assert len(result.metrics) == 1  # it still runs, as asked
    assert any("group_size is 1" in m and "nothing can be learned" in m for m in caplog.messages)
