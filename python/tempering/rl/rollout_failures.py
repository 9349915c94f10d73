"""Rollout failures: the errors, how each is counted and logged, and when a step stops.

An env that raises, times out, returns a reward that is not a finite number, or makes no envs
fails its rollout (or its group), never the run: :class:`FailureStats` counts it by type
(``rollout/failed/<Type>``) and logs each distinct message once per run at WARNING. A training
step whose every group failed stops the run (:func:`raise_if_every_rollout_failed`).

Example::

    raise_if_every_rollout_failed(rollouts_P, step=3)   # RolloutsFailedError: step 3: every ...
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs

from tempering.rl.executors import RemoteEnvError
from tempering_protocols import TrajectoryGroup

__all__ = [
    "EmptyGroupError",
    "FailureStats",
    "RewardError",
    "RolloutsFailedError",
    "check_reward",
    "describe",
    "failure_key",
    "raise_if_every_rollout_failed",
    "warn_if_nothing_to_learn",
]

_log = logging.getLogger("tempering.rl.rollouts")


class _Outcome(Protocol):
    """What :func:`raise_if_every_rollout_failed` reads of a ``GroupRollout``."""

    @property
    def index(self) -> int: ...
    @property
    def group(self) -> TrajectoryGroup | None: ...
    @property
    def failures(self) -> Mapping[str, int]: ...
    @property
    def first_error(self) -> BaseException | None: ...


class RolloutsFailedError(RuntimeError):
    """Every group of a training step failed: nothing can be trained on. The message names the
    failure counts and the first error (also the ``__cause__``)."""


class EmptyGroupError(ValueError):
    """``make_envs`` returned no envs."""


class RewardError(ValueError):
    """An env or group builder returned a reward that is not a finite number."""


def check_reward(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RewardError(
            f"{where} returned the reward {value!r} ({type(value).__name__}); rewards must be finite numbers"
        )
    return float(value)


def warn_if_nothing_to_learn(max_tokens: int, group_size: object, *, teacher: bool = False) -> str | None:
    """Log at WARNING, and return, why an RL run with these settings cannot learn (``None``: it
    can): no sampled tokens, or groups of one (whose advantage against the group's mean is 0)."""
    why: str | None = None
    if max_tokens < 1:
        why = f"max_tokens is {max_tokens}: no token is sampled, so nothing can be learned"
    elif group_size == 1 and not teacher:
        why = (
            "group_size is 1: every advantage (reward minus the group's mean) is 0, so nothing can be "
            "learned; use group_size >= 2"
        )
    if why is not None:
        _log.warning("%s", why)
    return why


def raise_if_every_rollout_failed(rollouts: Sequence[_Outcome], step: int) -> None:
    """Raise :class:`RolloutsFailedError` when no group of ``rollouts`` (a step's) finished and
    at least one failed with an error: training on would train on nothing, step after step.

    Example::

        raise_if_every_rollout_failed(rollouts_P, step=3)
    """
    if not rollouts or any(r.group is not None for r in rollouts):
        return
    errors = [r.first_error for r in sorted(rollouts, key=lambda r: r.index) if r.first_error is not None]
    if not errors:
        return
    counts: Counter[str] = Counter()
    for r in rollouts:
        counts.update(r.failures)
    first = errors[0]
    detail = ", ".join(f"{k.removeprefix('rollout/failed/')}: {v}" for k, v in sorted(counts.items()))
    raise RolloutsFailedError(
        f"step {step}: every rollout failed ({len(rollouts)} group(s); {detail}), so nothing can be "
        f"trained on. The first error: {describe(first)}"
    ) from first


def describe(exc: BaseException) -> str:
    name = exc.type_name if isinstance(exc, RemoteEnvError) else type(exc).__name__
    text = exc.message if isinstance(exc, RemoteEnvError) else str(exc)
    return f"{name}: {text}" if text else name


@attrs.define
class FailureStats:
    """One group's counters: sampling and env time, requests, and failures (by type, with the
    first error); each distinct message is logged once per run (``warned``, shared)."""

    index: int
    warned: set[str]
    sampling_s: float = 0.0
    env_s: float = 0.0
    n_sample_requests: int = 0
    failures: Counter[str] = attrs.field(factory=Counter[str])
    first_error: BaseException | None = None

    def fail(self, exc: BaseException, what: str) -> None:
        """Count a failure; log its message at WARNING the first time it is seen in the run."""
        key = failure_key(exc)
        self.failures[key] += 1
        if self.first_error is None:
            self.first_error = exc
        text = describe(exc)
        if text not in self.warned:
            if len(self.warned) < 10_000:
                self.warned.add(text)
            _log.warning(
                "%s of group %d failed: %s (counted in %s; later failures with this message are "
                "only counted)",
                what,
                self.index,
                text,
                key,
            )


def failure_key(exc: BaseException) -> str:
    name = exc.type_name if isinstance(exc, RemoteEnvError) else type(exc).__name__
    return f"rollout/failed/{name}"
