"""What every trainer shares: run directory, metrics, checkpoints, exact resume, LR schedules,
Adam settings, the progress bar. See docs/training.md.

- :class:`TrainingLoop` builds (or restores) the training client and writes the run directory;
  :func:`run_pipelined` runs a trainer's steps one ahead through it.
- :class:`RunDir`: ``config.json``, ``metrics.jsonl``, ``checkpoints.jsonl``, ``state.json``.
- :class:`AdamConfig` / :class:`LRSchedule`: per-step ``tinker.AdamParams``;
  :func:`fine_tuning_adam`: the fine-tuning trainers' default.
- :class:`RunConfig`: where a run writes, how often it checkpoints (the model it trains is
  ``tempering.backend.ModelConfig``).
- :class:`FineTuningConfig`: what the fine-tuning trainers' configs share (run, model, Adam,
  epochs, step limit); SFT's, DPO's, the reward model's and top-K distillation's subclass it.

Example::

    loop = await TrainingLoop.open(config.run, config.model, config, total_steps=n, batches_per_epoch=b)
    await run_pipelined(loop, submit)   # submit(step) queues one step, returns its finisher
    await loop.finish()
"""

from tempering.training.fine_tuning import FineTuningConfig
from tempering.training.loggers import MetricSink, TensorBoardSink, WandbSink, make_sinks
from tempering.training.loop import (
    TEST_KILL_ENV,
    PendingStep,
    RunConfig,
    TrainingLoop,
    TrainResult,
    run_pipelined,
)
from tempering.training.progress import ProgressBar, format_duration
from tempering.training.rundir import (
    CheckpointRecord,
    IfExists,
    RunDir,
    RunExistsError,
    RunLockedError,
    config_to_json,
)
from tempering.training.schedule import AdamConfig, LRSchedule, ScheduleKind, fine_tuning_adam

__all__ = [
    "TEST_KILL_ENV",
    "AdamConfig",
    "CheckpointRecord",
    "FineTuningConfig",
    "IfExists",
    "LRSchedule",
    "MetricSink",
    "PendingStep",
    "ProgressBar",
    "RunConfig",
    "RunDir",
    "RunExistsError",
    "RunLockedError",
    "ScheduleKind",
    "TensorBoardSink",
    "TrainResult",
    "TrainingLoop",
    "WandbSink",
    "config_to_json",
    "fine_tuning_adam",
    "format_duration",
    "make_sinks",
    "run_pipelined",
]
