"""Reinforcement learning on env groups: the data path lives in :mod:`tempering.rl.data`.

Example::

    from tempering.rl.data import compute_advantages, trajectories_to_datums
    from tempering.rl import read_trajectories, select_episodes, trajectory_examples   # logs
"""

from tempering.rl.batch_policy import BatchPolicy
from tempering.rl.executors import InlineExecutor, ProcessPoolExecutor, RolloutExecutor
from tempering.rl.importance import ImportanceCorrection
from tempering.rl.interleaved import InterleavedRLDatasetBuilder, InterleavingError
from tempering.rl.policy import GroupTokenCompleter, TinkerTokenCompleter
from tempering.rl.rollout_policy import RolloutFailFastError, RolloutInfo, TurnInfo
from tempering.rl.rollouts import MASK_TURN, GroupRollout, RolloutConfig, rollout_batch, rollout_group
from tempering.rl.schedules import is_fresh
from tempering.rl.train import RLConfig, train
from tempering.rl.trajectories import TRAJECTORY_SCHEMA, TrajectoryLogError, episodes_table, read_trajectories
from tempering.rl.trajectory_data import (
    learning_history_examples,
    select_episodes,
    supervised_dataset,
    trajectory_examples,
)

__all__ = [
    "MASK_TURN",
    "TRAJECTORY_SCHEMA",
    "BatchPolicy",
    "GroupRollout",
    "GroupTokenCompleter",
    "ImportanceCorrection",
    "InlineExecutor",
    "InterleavedRLDatasetBuilder",
    "InterleavingError",
    "ProcessPoolExecutor",
    "RLConfig",
    "RolloutConfig",
    "RolloutExecutor",
    "RolloutFailFastError",
    "RolloutInfo",
    "TinkerTokenCompleter",
    "TrajectoryLogError",
    "TurnInfo",
    "episodes_table",
    "is_fresh",
    "learning_history_examples",
    "read_trajectories",
    "rollout_batch",
    "rollout_group",
    "select_episodes",
    "supervised_dataset",
    "train",
    "trajectory_examples",
]
