"""A verifiers environment's dataset as tempering's RL dataset builder.

=============================  =============================================================
what                           where
=============================  =============================================================
one row, ``group_size`` times  :class:`VerifiersGroupBuilder` (picklable: the env's name, its
                               arguments as JSON and the row index; the env loads in
                               ``make_envs``, once per process)
batches of rows                :class:`VerifiersDataset` (``batch_size`` rows a batch,
                               shuffled by ``seed``, reshuffled each epoch)
``tempering rl`` builder       :class:`VerifiersTask`: the env's ``dataset`` trains, its
                               ``eval_dataset`` (when it has one) is the test set
=============================  =============================================================

Example::

    train, test = await VerifiersTask(env="my-env", env_args='{"n": 20}', group_size=4)()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from tempering.envs.problem import batch_picks
from tempering.envs.task_base import PolicyTask
from tempering.envs.verifiers_env import (
    VerifiersEnv,
    VerifiersEnvError,
    finite_reward,
    load_verifiers_env,
    parse_env_args,
    rubric_metrics,
)
from tempering_protocols import Env, EnvGroupBuilder, Metrics, Renderer, RLDataset, Trajectory

__all__ = ["Split", "VerifiersDataset", "VerifiersGroupBuilder", "VerifiersTask", "split_rows"]

Split = Literal["train", "eval"]


def split_rows(env: Any, split: Split) -> Any:
    """The env's dataset of ``split`` (``eval``: its eval dataset, else its train dataset)."""
    return env.get_dataset() if split == "train" else env.get_eval_dataset()


def _has_group_rewards(env: Any) -> bool:
    return bool(env.rubric.has_group_rewards)


class _Live:
    """The envs a group made (to cancel abandoned rollouts in ``cleanup``); pickles empty."""

    def __init__(self) -> None:
        self.envs: list[VerifiersEnv] = []

    def __reduce__(self) -> tuple[type[_Live], tuple[()]]:
        return (_Live, ())


@attrs.frozen
class VerifiersGroupBuilder(EnvGroupBuilder):
    """``group_size`` rollouts of row ``index`` of env ``env_name``'s ``split`` dataset.

    Example::

        group = VerifiersGroupBuilder("my-env", "{}", "train", 0, renderer, group_size=4)
        envs = await group.make_envs()
    """

    env_name: str
    env_args: str
    split: Split
    index: int
    renderer: Renderer = attrs.field(eq=False)
    group_size: int = attrs.field(default=4, kw_only=True)
    timeout_s: float = attrs.field(default=60.0, kw_only=True)
    _live: _Live = attrs.field(factory=_Live, init=False, eq=False, repr=False)

    def _env(self) -> Any:
        return load_verifiers_env(self.env_name, parse_env_args(self.env_args, self.env_name))

    async def make_envs(self) -> Sequence[Env]:
        env = self._env()
        row = split_rows(env, self.split)[self.index]
        score = not _has_group_rewards(env)
        envs = [
            VerifiersEnv(env, self.env_name, row, self.renderer, timeout_s=self.timeout_s, score=score)
            for _ in range(self.group_size)
        ]
        self._live.envs.extend(envs)
        return envs

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        env = self._env()
        if not _has_group_rewards(env):
            return [(0.0, {}) for _ in trajectories_G]
        members = [e for e in envs_G if isinstance(e, VerifiersEnv)]
        states = [e.state for e in members]
        if len(members) != len(envs_G) or any(s is None for s in states):
            raise VerifiersEnvError(
                f"verifiers env {self.env_name!r}: a group member has no finished rollout to score"
            )
        try:
            await env.rubric.score_group(states)
            for state in states:
                await env.rubric.cleanup(state)
        except Exception as exc:
            raise VerifiersEnvError(
                f"verifiers env {self.env_name!r}: its rubric's score_group raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        out: list[tuple[float, Metrics]] = []
        for state in states:
            what = f"verifiers env {self.env_name!r}'s rubric (score_group)"
            reward = finite_reward(state.get("reward"), what)
            metrics = rubric_metrics(state)
            metrics["verifiers/passed"] = int(reward >= float(getattr(env, "pass_threshold", 0.5)))
            out.append((float(reward), metrics))
        return out

    def logging_tags(self) -> list[str]:
        return [f"verifiers/{self.env_name}"]

    async def cleanup(self) -> None:
        for env in self._live.envs:
            env.close()
        self._live.envs.clear()


@attrs.frozen
class VerifiersDataset(RLDataset):
    """``batch_size`` rows of ``n_rows`` per batch (shuffled by ``seed``), ``group_size``
    rollouts each; ``len`` is ``n_batches`` (default: one pass)."""

    env_name: str
    env_args: str
    split: Split
    n_rows: int
    renderer: Renderer = attrs.field(eq=False)
    batch_size: int = attrs.field(kw_only=True)
    group_size: int = attrs.field(kw_only=True)
    seed: int = attrs.field(default=0, kw_only=True)
    n_batches: int | None = attrs.field(default=None, kw_only=True)
    timeout_s: float = attrs.field(default=60.0, kw_only=True)

    def __len__(self) -> int:
        if self.n_batches is not None:
            return self.n_batches
        return max(1, self.n_rows // self.batch_size)

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]:
        picks = batch_picks(self.n_rows, self.batch_size, self.seed, index)
        return [
            VerifiersGroupBuilder(
                self.env_name,
                self.env_args,
                self.split,
                i,
                self.renderer,
                group_size=self.group_size,
                timeout_s=self.timeout_s,
            )
            for i in picks
        ]


def _check_positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{type(instance).__name__}.{attribute.name} must be at least 1, got {value}")


@attrs.frozen(kw_only=True)
class VerifiersTask(PolicyTask):
    """Train on an installed verifiers environment (``tempering rl --verifiers-env NAME``): its
    dataset's rows, ``group_size`` rollouts each, rewarded by its rubric; its eval dataset (when
    it has one; ``n_test`` rows of it) is the test set."""

    env: str = ""
    """The verifiers environment's name (its module: ``-`` read as ``_``)."""
    env_args: str = "{}"
    """Keyword arguments of its ``load_environment``, as a JSON object."""
    batch_size: int = attrs.field(default=4, validator=_check_positive)
    """Rows per training batch."""
    group_size: int = attrs.field(default=4, validator=_check_positive)
    """Rollouts per row (one group)."""
    n_batches: int | None = None
    """Training batches (default: one pass over the rows)."""
    n_test: int = 16
    """Rows of the eval dataset in the test set (0: no test set)."""
    test_group_size: int = attrs.field(default=2, validator=_check_positive)
    """Rollouts per test row."""
    seed: int = 0
    """Seeds the batch order; the test set samples with seed + 1."""
    timeout_s: float = 60.0
    """Longest the env may take between two model calls (or to score) before its rollout fails."""

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        args = parse_env_args(self.env_args, self.env)
        env = load_verifiers_env(self.env, args)
        renderer = self.renderer()
        try:
            rows = len(split_rows(env, "train"))
        except ValueError as exc:
            raise ValueError(
                f"verifiers env {self.env!r} has no training dataset ({exc}); it can only be evaluated"
            ) from exc
        if rows == 0:
            raise ValueError(f"verifiers env {self.env!r}: its training dataset is empty")
        train = VerifiersDataset(
            self.env,
            self.env_args,
            "train",
            rows,
            batch_size=self.batch_size,
            group_size=self.group_size,
            seed=self.seed,
            n_batches=self.n_batches,
            renderer=renderer,
            timeout_s=self.timeout_s,
        )
        if self.n_test < 1 or (env.eval_dataset_source is None and env.eval_dataset is None):
            return train, None
        n_eval = min(self.n_test, len(split_rows(env, "eval")))
        test = VerifiersDataset(
            self.env,
            self.env_args,
            "eval",
            n_eval,
            batch_size=n_eval,
            group_size=self.test_group_size,
            seed=self.seed + 1,
            n_batches=1,
            renderer=renderer,
            timeout_s=self.timeout_s,
        )
        return train, test
