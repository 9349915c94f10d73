"""``tempering view``: a page of a run's curves, rollouts, config and checkpoints (docs/view.md).

It reads the run directory's files only (``metrics.jsonl``, ``trajectories/``, ``config.json``,
``checkpoints.jsonl``), so it can watch a run in progress without ever blocking its trainer.

Example::

    from tempering.view import write_static
    write_static(["runs/rl"], "rl.html")
"""

from tempering.view.app import PortInUseError, build_app, check_port, serve, static_data, write_static
from tempering.view.data import NotARunError, Run, downsample, find_runs, write_eval_rollouts

__all__ = [
    "NotARunError",
    "PortInUseError",
    "Run",
    "build_app",
    "check_port",
    "downsample",
    "find_runs",
    "serve",
    "static_data",
    "write_eval_rollouts",
    "write_static",
]
