"""``tempering view``: a page of a run's curves, rollouts, config and checkpoints (docs/view.md).

It reads the run directory's files only (``metrics.jsonl``, ``trajectories/``, ``config.json``,
``checkpoints.jsonl``, ``summary.json``), so it can watch a run in progress without ever blocking
its trainer. A recipe's directory is one run with its stages on one step axis
(:mod:`tempering.view.runs`, :mod:`tempering.view.curves`); :mod:`tempering.view.compare` sets
an evaluation's held-out answers beside another's.

Example::

    from tempering.view import write_static
    write_static(["runs/rl"], "rl.html")
"""

from tempering.view.app import PortInUseError, build_app, check_port, serve, static_data, write_static
from tempering.view.compare import comparison
from tempering.view.data import NotARunError, Run, Stage, downsample, find_runs, write_eval_rollouts

__all__ = [
    "NotARunError",
    "PortInUseError",
    "Run",
    "Stage",
    "build_app",
    "check_port",
    "comparison",
    "downsample",
    "find_runs",
    "serve",
    "static_data",
    "write_eval_rollouts",
    "write_static",
]
