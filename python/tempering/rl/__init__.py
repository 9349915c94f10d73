"""Reinforcement learning on env groups: the data path lives in :mod:`tempering.rl.data`.

Example::

    from tempering.rl.data import compute_advantages, trajectories_to_datums
"""

from tempering.rl.executors import InlineExecutor, ProcessPoolExecutor, RolloutExecutor
from tempering.rl.policy import GroupTokenCompleter, TinkerTokenCompleter
from tempering.rl.rollouts import MASK_TURN, GroupRollout, RolloutConfig, rollout_batch, rollout_group
from tempering.rl.train import RLConfig, RLResult, is_fresh, train

__all__ = [
    "MASK_TURN",
    "GroupRollout",
    "GroupTokenCompleter",
    "InlineExecutor",
    "ProcessPoolExecutor",
    "RLConfig",
    "RLResult",
    "RolloutConfig",
    "RolloutExecutor",
    "TinkerTokenCompleter",
    "is_fresh",
    "rollout_batch",
    "rollout_group",
    "train",
]
