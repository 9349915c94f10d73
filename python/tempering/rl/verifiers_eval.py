"""Evaluate a model on an installed verifiers environment (``tempering eval --verifiers-env``).

The env's eval dataset (its train dataset when it has none) is rolled out as the RL loop does
(:mod:`tempering.envs.verifiers_env`: tempering samples every turn, the env's rubric scores), and
summarised: the mean reward with its spread, the pass rate (reward at least the env's
``pass_threshold``) with a 95% Wilson interval, the mean of every rubric function, and the
rollouts that failed (the env raised, hung or gave a non-finite reward), counted, not fatal.

Example::

    result = await evaluate_verifiers(sampler, renderer, "my-env", "{}", n=20, group_size=2, max_tokens=256)
    result.metrics()  # {"verifiers/my-env/mean_reward": ..., "verifiers/my-env/pass_rate": ..., ...}
"""

from __future__ import annotations

import math
import statistics
from collections import Counter

import attrs

from tempering.envs.verifiers_data import VerifiersDataset, split_rows
from tempering.envs.verifiers_env import load_verifiers_env, parse_env_args
from tempering.evals.stats import wilson_interval
from tempering.rl.policy import TinkerTokenCompleter, sampling_seed
from tempering.rl.rollout_failures import describe
from tempering.rl.rollouts import RolloutConfig, rollout_batch
from tempering_protocols import Renderer, SamplingClient

__all__ = ["VerifiersEvalResult", "evaluate_verifiers", "print_verifiers_table"]


_OWN = frozenset({"verifiers/passed", "verifiers/parse_error", "verifiers/turns"})
"""The adapter's own metrics of a rollout (not the rubric's)."""


@attrs.frozen
class VerifiersEvalResult:
    """What :func:`evaluate_verifiers` measured (rewards of the rollouts that finished)."""

    env: str
    env_args: str
    rows: int
    group_size: int
    rewards: list[float]
    passed: int
    ci_low: float
    ci_high: float
    rubric_means: dict[str, float]
    failures: dict[str, int]
    first_error: str | None

    kind = "verifiers"

    @property
    def finished(self) -> int:
        return len(self.rewards)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    @property
    def mean_reward(self) -> float:
        return statistics.fmean(self.rewards) if self.rewards else math.nan

    @property
    def pass_rate(self) -> float:
        return self.passed / self.finished if self.finished else math.nan

    def metrics(self) -> dict[str, float]:
        """``verifiers/<env>/<metric>``: mean_reward, reward_std, pass_rate and its interval,
        finished, failed, and each rubric function's mean."""
        std = statistics.pstdev(self.rewards) if len(self.rewards) > 1 else 0.0
        out = {
            "mean_reward": self.mean_reward,
            "reward_std": std,
            "pass_rate": self.pass_rate,
            "pass_rate_ci_low": self.ci_low,
            "pass_rate_ci_high": self.ci_high,
            "finished": float(self.finished),
            "failed": float(self.failed),
            **{f"rubric/{k}": v for k, v in self.rubric_means.items()},
        }
        return {f"verifiers/{self.env}/{k}": v for k, v in out.items()}

    def to_json(self) -> dict[str, object]:
        return {
            "kind": "verifiers",
            "benchmark": f"verifiers:{self.env}",
            "env_args": self.env_args,
            "rows": self.rows,
            "group_size": self.group_size,
            "metrics": self.metrics(),
            "rewards": self.rewards,
            "failures": self.failures,
            "first_error": self.first_error,
        }


async def evaluate_verifiers(
    sampler: SamplingClient,
    renderer: Renderer,
    env: str,
    env_args: str = "{}",
    *,
    n: int | None = None,
    group_size: int = 1,
    max_tokens: int = 256,
    temperature: float = 1.0,
    seed: int = 0,
    timeout_s: float = 60.0,
) -> VerifiersEvalResult:
    """Roll out ``group_size`` replies to each of the first ``n`` rows (all: ``None``) of env
    ``env``'s eval dataset with ``sampler`` and summarise them (see the module docstring)."""
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    loaded = load_verifiers_env(env, parse_env_args(env_args, env))
    available = len(split_rows(loaded, "eval"))
    rows = available if n is None else min(n, available)
    if rows < 1:
        raise ValueError(f"verifiers env {env!r}: its eval dataset has no rows to evaluate")
    dataset = VerifiersDataset(
        env,
        env_args,
        "eval",
        rows,
        renderer,
        batch_size=rows,
        group_size=group_size,
        seed=seed,
        n_batches=1,
        timeout_s=timeout_s,
    )
    policy = TinkerTokenCompleter(sampler, max_tokens=max_tokens, temperature=temperature)
    rollouts = await rollout_batch(
        dataset.get_batch(0), policy, RolloutConfig(), seed=sampling_seed(seed, "verifiers-eval", 0)
    )
    threshold = float(getattr(loaded, "pass_threshold", 0.5))
    rewards: list[float] = []
    sums: dict[str, float] = {}
    counts: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    first_error: str | None = None
    for r in rollouts:
        failures.update(r.failures)
        if r.first_error is not None and first_error is None:
            first_error = describe(r.first_error)
        if r.group is None:
            continue
        rewards += r.group.get_total_rewards()
        for traj, final in zip(r.group.trajectories_G, r.group.metrics_G, strict=True):
            last = dict(traj.transitions[-1].metrics) if traj.transitions else {}
            for k, v in {**last, **final}.items():
                if k.startswith("verifiers/") and k not in _OWN:
                    name = k.removeprefix("verifiers/")
                    sums[name] = sums.get(name, 0.0) + float(v)
                    counts[name] += 1
    passed = sum(1 for x in rewards if x >= threshold)
    low, high = wilson_interval(passed, len(rewards))
    return VerifiersEvalResult(
        env=env,
        env_args=env_args,
        rows=rows,
        group_size=group_size,
        rewards=rewards,
        passed=passed,
        ci_low=low,
        ci_high=high,
        rubric_means={k: sums[k] / counts[k] for k in sorted(sums)},
        failures={k.removeprefix("rollout/failed/"): v for k, v in sorted(failures.items())},
        first_error=first_error,
    )


def print_verifiers_table(result: VerifiersEvalResult) -> None:
    """Print the result (rich): mean reward and spread, pass rate with its 95% interval,
    finished and failed rollouts, each rubric function's mean, the first failure."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"verifiers env {result.env} ({result.rows} rows x {result.group_size})")
    table.add_column("metric")
    table.add_column("value")
    for name, value in result.metrics().items():
        table.add_row(name.removeprefix(f"verifiers/{result.env}/"), f"{value:.4f}")
    Console().print(table)
    if result.first_error is not None:
        print(f"first failed rollout: {result.first_error}")
