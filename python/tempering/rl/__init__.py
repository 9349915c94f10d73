"""Reinforcement learning on env groups: the data path lives in :mod:`tempering.rl.data`.

Example::

    from tempering.rl.data import compute_advantages, trajectories_to_datums
"""
