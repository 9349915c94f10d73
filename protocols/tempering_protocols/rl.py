"""Reinforcement-learning protocols: environments, groups of them, and datasets of groups.

An ``Env`` is single-use: it is created by an ``EnvGroupBuilder``, played once to the end,
and thrown away. There is no ``reset``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from tempering_protocols.types import Action, Metrics, Observation, StepResult, StopCondition, Trajectory

__all__ = [
    "MASK_TURN",
    "PARSE_ERROR_MASKED",
    "TOOL_CALLS",
    "Env",
    "EnvGroupBuilder",
    "RLDataset",
    "RLDatasetBuilder",
    "metrics_mask_turn",
]

MASK_TURN = "turn/masked"
"""Metrics key: an env that sets ``StepResult.metrics[MASK_TURN] = 1`` has that turn masked
(its action tokens get mask 0 and advantage 0 in the datum)."""

PARSE_ERROR_MASKED = "parse_error_masked"
"""The Tinker Cookbook's metrics key for the same: ``StepResult.metrics[PARSE_ERROR_MASKED] = 1``
masks the turn exactly as :data:`MASK_TURN` does (envs written for the cookbook keep working)."""

TOOL_CALLS = "turn/tool_calls"
"""Metrics key: the number of tool calls a turn made (``StepResult.metrics[TOOL_CALLS] = 2``); the
rollout sums it over the episode for ``RolloutConfig.max_tool_calls``."""


def metrics_mask_turn(metrics: Mapping[str, float | int] | None, /) -> bool:
    """Whether a turn's metrics mask it: :data:`MASK_TURN` or :data:`PARSE_ERROR_MASKED` set
    (non-zero). The rollout, the data core (``Transition.metrics`` of a transition built by user
    code or read from a Cookbook log) and the trajectory files all use this rule.

    Example::

        metrics_mask_turn({"parse_error_masked": 1})  # True
        metrics_mask_turn({"turn/masked": 0})  # False
    """
    if not metrics:
        return False
    return bool(metrics.get(MASK_TURN, 0) or metrics.get(PARSE_ERROR_MASKED, 0))


@runtime_checkable
class Env(Protocol):
    """A single-use environment driven by token-level actions.

    Example::

        class Echo:
            async def initial_observation(self):
                return tinker.ModelInput.from_ints([1, 2]), [0]
            async def step(self, action):
                return StepResult(reward=float(action == [2]), episode_done=True,
                                  next_observation=tinker.ModelInput.empty(),
                                  next_stop_condition=[0])
    """

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        """The first observation and where sampling of the first action stops."""
        ...

    async def step(self, action: Action, /) -> StepResult:
        """Apply one action. After a result with ``episode_done=True`` the env is finished."""
        ...


@runtime_checkable
class EnvGroupBuilder(Protocol):
    """Builds the ``G`` envs of one group, and scores the group once every env has finished.

    Builders must pickle (they are shipped to worker processes) and should be cheap to create:
    heavy state is built in ``make_envs``. Subclass this protocol explicitly to inherit the
    defaults of ``compute_group_rewards`` (no group reward), ``logging_tags`` and ``cleanup``.

    Example::

        @attrs.frozen
        class EchoGroup(EnvGroupBuilder):
            group_size: int
            async def make_envs(self):
                return [Echo() for _ in range(self.group_size)]
    """

    async def make_envs(self) -> Sequence[Env]:
        """Create the group's envs, fresh, in member order."""
        ...

    async def compute_group_rewards(
        self, trajectories_G: Sequence[Trajectory], envs_G: Sequence[Env], /
    ) -> list[tuple[float, Metrics]]:
        """A final reward and metrics for each member, e.g. from a pairwise comparison."""
        return [(0.0, {}) for _ in trajectories_G]

    def logging_tags(self) -> list[str]:
        """Tags under which this group's metrics are also aggregated (e.g. the dataset name)."""
        return []

    async def cleanup(self) -> None:
        """Release what ``make_envs`` acquired. Always called, also after failures."""
        return None


@runtime_checkable
class RLDataset(Protocol):
    """Batches of env groups: ``get_batch(i)`` yields the ``P`` builders of batch ``i``."""

    def get_batch(self, index: int, /) -> Sequence[EnvGroupBuilder]: ...

    def __len__(self) -> int: ...


@runtime_checkable
class RLDatasetBuilder(Protocol):
    """A serializable config that builds the train dataset and an optional test dataset."""

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]: ...
