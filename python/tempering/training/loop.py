"""The bookkeeping every trainer shares: the training client, the run directory, checkpoints,
resume, metrics lines and the progress bar. Trainers (SFT, DPO, reward model, RL) supply only
what one step submits; :func:`run_pipelined` does the rest.

Exact resume, and how it is kept:

1. A checkpoint is ``save_state`` (weights + optimizer, written atomically by the backend),
   with ``save_weights_for_sampler`` too when sampler weights are on
   (``RunConfig.save_sampler_weights``), followed by a record in ``checkpoints.jsonl``
   (rewritten atomically) holding the step, the data position and the paths. The record is
   written only after every save of the checkpoint completed; a checkpoint without its record
   is ignored.
2. The metrics line of a step is written after its ``optim_step`` completes, and a
   checkpoint's record only after the metrics lines of every step before it.
3. On resume the client is restored from the last record with its optimizer state
   (``create_training_client_from_state_with_optimizer``), ``metrics.jsonl`` is cut back to
   the steps before it, and the run continues with the record's step. Batches depend only on
   (seed, epoch, index) and the learning rate only on the step, so the resumed run submits
   exactly the requests the uninterrupted one would have.

Example::

    loop = await TrainingLoop.open(config.run, config.model, config, total_steps=100,
                                   batches_per_epoch=len(train))

    async def submit(step: int) -> PendingStep:
        epoch, index = loop.position(step)
        fb = loop.client.forward_backward(batch(epoch, index), "cross_entropy")
        opt = loop.client.optim_step(config.adam.adam_params(step, loop.total_steps))
        async def finish() -> dict[str, float]:
            return {"loss": (await fb).metrics["loss:sum"], **(await opt).metrics}
        return finish

    async with loop:  # closes the metric sinks and the bar, on error too
        await run_pipelined(loop, submit)
        final = await loop.finish()
"""

from __future__ import annotations

import inspect
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import attrs
from tinker import types as ttypes

from tempering.backend import ModelConfig, ServiceClient, end_session, service_client
from tempering.training.loggers import MetricSink, make_sinks
from tempering.training.progress import ProgressBar
from tempering.training.retention import checkpoint_remover, prune_run
from tempering.training.rundir import CheckpointRecord, IfExists, RunDir, config_to_json
from tempering_protocols import (
    Future,
    SamplingClient,
    SamplingClientEvaluator,
    TrainingClient,
    TrainingClientEvaluator,
)

__all__ = [
    "TEST_KILL_ENV",
    "PendingStep",
    "RunConfig",
    "TrainResult",
    "TrainingLoop",
    "eval_due",
    "run_pipelined",
    "run_to_end",
    "saved_sampling_client",
    "step_line",
]

TEST_KILL_ENV = "TEMPERING_TEST_KILL_AT"
"""Test hook: ``"<point>:<step>"`` makes the process SIGKILL itself at that point of that step
(points: ``before_metrics``, ``before_index``, ``after_index``). Used by the resume tests."""

PendingStep = Callable[[], Awaitable[Mapping[str, float]]]
"""What a trainer's ``submit(step)`` returns: awaits the step's results and returns its metrics."""


def eval_due(steps_done: int, total_steps: int, eval_every: int) -> bool:
    """Whether a run of ``total_steps`` evaluates after ``steps_done`` steps: every
    ``eval_every`` steps (0: never in between) and after the last."""
    return steps_done == total_steps or (eval_every > 0 and steps_done % eval_every == 0)


@attrs.frozen
class TrainResult:
    """What every trainer (SFT, DPO, reward model, RL) returns: the run's final checkpoint
    record and its metrics lines (one per step; RL: those written by this process, the others:
    every line of the run)."""

    final: CheckpointRecord
    metrics: list[dict[str, Any]]


def _check_keep_last(value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"--run.keep-last must be >= 1 (a resume needs the newest checkpoint), got {value}")


@attrs.frozen(kw_only=True)
class RunConfig:
    """Where a run writes and how often it checkpoints and evaluates.

    A resume continues from the last checkpoint, and only when the config equals the recorded
    one; there is never an interactive prompt. A periodic checkpoint with sampler weights records
    their path (``sampler_path``) in its index entry; the final checkpoint always has them.
    """

    log_dir: str
    """The run directory: config, metrics.jsonl, checkpoints.jsonl, logs."""
    if_exists: IfExists = "resume"
    """When ``log_dir`` holds a run: ``resume`` it (same config only), ``refuse`` or ``overwrite``."""
    save_every: int = 20
    """Checkpoint every this many optimizer steps (0: only at the end)."""
    eval_every: int = 10
    """Evaluate every this many optimizer steps (0: only at the end)."""
    wandb_project: str | None = None
    """Also log metrics to this Weights & Biases project (``pip install 'tempering[logging]'``)."""
    tensorboard: bool = False
    """Also write TensorBoard event files under ``log_dir/logs`` (``pip install 'tempering[logging]'``)."""
    progress: bool = True
    """Show a progress bar on a terminal (plain periodic lines elsewhere)."""
    save_sampler_weights: bool | None = None
    """Periodic checkpoints also save sampler weights; ``None``: the trainer's default (on for RL,
    off for SFT, DPO and reward models)."""
    keep_last: int | None = attrs.field(default=None, validator=lambda _i, _a, v: _check_keep_last(v))
    """Keep only the newest ``keep_last`` periodic checkpoints (deleting the older ones' files
    and index entries after each save); the final checkpoint and the newest one, which a resume
    starts from, are always kept. ``None`` (the default): keep every checkpoint."""


def _kill_point(point: str, step: int) -> None:
    spec = os.environ.get(TEST_KILL_ENV)
    if spec and spec == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


@attrs.define
class _PendingCheckpoint:
    record: CheckpointRecord
    future: Future[ttypes.SaveWeightsResponse]
    sampler: Future[ttypes.SaveWeightsForSamplerResponse] | None = None

    async def completed(self) -> CheckpointRecord:
        """The record with the saved paths, once every save of the checkpoint completed."""
        state_path = (await self.future).path
        sampler_path = None if self.sampler is None else (await self.sampler).path
        return attrs.evolve(self.record, state_path=state_path, sampler_path=sampler_path)


async def saved_sampling_client(client: TrainingClient) -> SamplingClient:
    """``client.save_weights_and_get_sampling_client()``, usable from async code.

    The local engine's client comes back at once (its requests wait for the snapshot). The
    tinker SDK returns a future of the client; it is awaited here, since using it as the client
    before it resolves would block the event loop (the SDK warns "calling sync from async")."""
    sampler = client.save_weights_and_get_sampling_client()
    if inspect.isawaitable(sampler):
        return cast(SamplingClient, await sampler)
    return sampler


class TrainingLoop:
    """A run's client and bookkeeping. Build it with :meth:`open`; see the module docstring.

    Attributes: ``client`` (the training client, restored on resume), ``service``, ``run_dir``
    (:class:`RunDir`), ``start_step`` (the first step this process runs), ``total_steps``,
    ``batches_per_epoch``, ``resumed``, ``resumed_from`` (the checkpoint record the run resumed
    from, else ``None``), ``save_sampler_weights`` (whether periodic checkpoints save sampler
    weights), ``owns_service`` (whether the loop created ``service`` and closes it on exit).
    """

    def __init__(
        self,
        *,
        client: TrainingClient,
        service: ServiceClient,
        run_dir: RunDir,
        run: RunConfig,
        start_step: int,
        total_steps: int,
        batches_per_epoch: int,
        resumed: bool,
        sinks: Sequence[MetricSink],
        progress_keys: Sequence[str],
        save_sampler_weights: bool = False,
        resumed_from: CheckpointRecord | None = None,
        owns_service: bool = False,
    ) -> None:
        self.client = client
        self.service = service
        self.owns_service = owns_service
        self.run_dir = run_dir
        self.run = run
        self.start_step = start_step
        self.total_steps = total_steps
        self.batches_per_epoch = batches_per_epoch
        self.resumed = resumed
        self.save_sampler_weights = save_sampler_weights
        self.resumed_from = resumed_from
        self._sinks = list(sinks)
        self._bar = ProgressBar(total_steps, start_step, keys=progress_keys, enabled=run.progress)
        self._t_start = time.monotonic()
        self._t_last = self._t_start

    @classmethod
    async def open(
        cls,
        run: RunConfig,
        model: ModelConfig,
        config: object,
        *,
        total_steps: int,
        batches_per_epoch: int,
        service: ServiceClient | None = None,
        progress_keys: Sequence[str] = ("loss", "lr"),
        sampler_weights_by_default: bool = False,
    ) -> TrainingLoop:
        """Open the run directory (resuming, refusing or overwriting as ``run.if_exists``
        says), and build the training client: restored with its optimizer from the last
        checkpoint, or fresh from ``model``. ``config`` (the whole attrs config) is what
        ``config.json`` records; its ``run`` field may differ on resume.
        ``sampler_weights_by_default``: whether periodic checkpoints save sampler weights when
        ``run.save_sampler_weights`` is ``None`` (the trainer's default)."""
        if total_steps < 1 or batches_per_epoch < 1:
            raise ValueError(f"nothing to train: {total_steps} steps, {batches_per_epoch} batches an epoch")
        run_dir, resumed = RunDir.open(
            run.log_dir, config, run.if_exists, ignore_on_resume=frozenset({"run"})
        )
        owns_service = service is None  # then the loop ends its session on exit
        service = service if service is not None else service_client()
        try:
            last = run_dir.last_checkpoint() if resumed else None
            if last is not None:
                try:
                    client = await service.create_training_client_from_state_with_optimizer(last.state_path)
                except Exception as exc:  # missing, truncated: name it, offer the previous one
                    raise run_dir.unreadable_checkpoint(last, exc) from exc
                start_step = last.step
            else:
                client = await model.create_training_client(service)
                start_step = 0
            run_dir.truncate_metrics(start_step)
            sinks = make_sinks(
                run_dir.path,
                config_to_json(config),
                wandb_project=run.wandb_project,
                tensorboard=run.tensorboard,
            )
            return cls(
                client=client,
                service=service,
                run_dir=run_dir,
                run=run,
                start_step=start_step,
                total_steps=total_steps,
                batches_per_epoch=batches_per_epoch,
                resumed=resumed,
                sinks=sinks,
                progress_keys=progress_keys,
                save_sampler_weights=(
                    sampler_weights_by_default
                    if run.save_sampler_weights is None
                    else run.save_sampler_weights
                ),
                resumed_from=last,
                owns_service=owns_service,
            )
        except BaseException as exc:
            run_dir.close()
            if owns_service:
                end_session(service, exc)
            raise

    @property
    def path(self) -> Path:
        return self.run_dir.path

    def position(self, step: int) -> tuple[int, int]:
        """``(epoch, batch index)`` of the data of ``step``: epochs follow each other, each
        reshuffled by ``set_epoch(epoch)``."""
        return divmod(step, self.batches_per_epoch)

    def eval_due(self, steps_done: int) -> bool:
        """Whether to evaluate the weights after ``steps_done`` steps (the last step always)."""
        return eval_due(steps_done, self.total_steps, self.run.eval_every)

    def save_if_due(self, steps_done: int) -> _PendingCheckpoint | None:
        """Queue ``save_state`` (and ``save_weights_for_sampler`` when
        :attr:`save_sampler_weights`) when a checkpoint is due after ``steps_done`` steps (the
        final one is :meth:`finish`'s). Submit it right after that step's ``optim_step``."""
        every = self.run.save_every
        if every <= 0 or steps_done % every != 0 or steps_done >= self.total_steps:
            return None
        return self._save(steps_done, final=False, sampler=self.save_sampler_weights)

    def _save(self, steps_done: int, *, final: bool, sampler: bool) -> _PendingCheckpoint:
        name = "final" if final else f"step-{steps_done:06d}"
        epoch, batch = self.position(steps_done)
        record = CheckpointRecord(
            name=name, step=steps_done, epoch=epoch, batch=batch, state_path="", final=final
        )
        state = self.client.save_state(name)
        weights = self.client.save_weights_for_sampler(name) if sampler else None
        return _PendingCheckpoint(record, state, weights)

    async def complete_step(
        self, step: int, metrics: Mapping[str, float], checkpoint: _PendingCheckpoint | None = None
    ) -> dict[str, Any]:
        """Write the metrics line of ``step`` (0-based), then the index record of a checkpoint
        queued after it. Call once per step, in step order, after its ``optim_step`` completed."""
        now = time.monotonic()
        epoch, batch = self.position(step)
        line: dict[str, Any] = {
            "step": step,
            "epoch": epoch,
            "batch": batch,
            "progress": (step + 1) / self.total_steps,
            **metrics,
            "time/step": now - self._t_last,
            "time/elapsed": now - self._t_start,
        }
        self._t_last = now
        _kill_point("before_metrics", step)
        self.run_dir.append_metrics(line)
        numeric = {k: float(v) for k, v in line.items() if isinstance(v, int | float)}
        for sink in self._sinks:
            sink.log(numeric, step)
        self._bar.update(1, line)
        if checkpoint is not None:
            record = await checkpoint.completed()
            _kill_point("before_index", step)
            self.run_dir.add_checkpoint(record)
            _kill_point("after_index", step)
            if self.run.keep_last is not None:
                prune_run(self.run_dir, self.run.keep_last, remove=checkpoint_remover(self.client))
        return line

    async def finish(self) -> CheckpointRecord:
        """Save the final state and sampler weights, record them, close the sinks and the bar.
        A run that was already complete returns its final record."""
        last = self.run_dir.last_checkpoint()
        if last is not None and last.final and last.step == self.total_steps:
            self.close()
            return last
        record = await self._save(self.total_steps, final=True, sampler=True).completed()
        self.run_dir.add_checkpoint(record)
        self.close()
        return record

    async def __aenter__(self) -> TrainingLoop:
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """Close the sinks and the progress bar, also when the run failed (a run that
        finished has closed them already; closing twice is harmless). A service the loop
        created itself (:meth:`open` without ``service``) is closed too: a hosted session is
        finished as ``success``, ``errored`` or ``interrupted``."""
        self.close()
        self.run_dir.close()  # the run directory's lock: another process may write it now
        if self.owns_service:
            self.owns_service = False
            end_session(self.service, exc)

    def close(self) -> None:
        self._bar.close()
        for sink in self._sinks:
            sink.close()
        self._sinks = []

    async def sampling_client(self) -> SamplingClient:
        """A sampling client for the weights once the requests queued so far have run (see
        :func:`saved_sampling_client`)."""
        return await saved_sampling_client(self.client)

    async def evaluate(
        self,
        training_evaluators: Sequence[TrainingClientEvaluator],
        sampling_evaluators: Sequence[SamplingClientEvaluator],
    ) -> dict[str, float]:
        """The evaluators' metrics on the weights as they are once the requests queued so far
        have run: ``training_evaluators`` on the training client, ``sampling_evaluators`` on
        weights saved for sampling now (saved only when there are any)."""
        out: dict[str, float] = {}
        for evaluator in training_evaluators:
            out |= await evaluator(self.client)
        if sampling_evaluators:
            sampler = await self.sampling_client()
            for evaluator in sampling_evaluators:
                out |= await evaluator(sampler)
        return out

    async def initial_sampling_client(self) -> SamplingClient:
        """A sampling client for the weights the run starts from: on a resume from a checkpoint
        with sampler weights, created from its ``sampler_path`` (no extra save); otherwise
        :meth:`sampling_client`."""
        last = self.resumed_from
        if last is not None and last.sampler_path is not None and last.step == self.start_step:
            return await self.service.create_sampling_client(model_path=last.sampler_path)
        return await self.sampling_client()


async def run_pipelined(loop: TrainingLoop, submit: Callable[[int], Awaitable[PendingStep]]) -> None:
    """Run steps ``loop.start_step .. loop.total_steps - 1``, one step ahead.

    ``submit(step)`` queues the step's requests (``forward_backward``, ``optim_step``, evals)
    and returns a :data:`PendingStep`. The next step is submitted before the previous one's
    results are read, so the backend always has work queued; checkpoints are queued right
    after their step, and lines and records are written in step order.
    """
    previous: tuple[int, PendingStep, _PendingCheckpoint | None] | None = None
    for step in range(loop.start_step, loop.total_steps):
        pending = await submit(step)
        checkpoint = loop.save_if_due(step + 1)
        if previous is not None:
            await loop.complete_step(previous[0], await previous[1](), previous[2])
        previous = (step, pending, checkpoint)
    if previous is not None:
        await loop.complete_step(previous[0], await previous[1](), previous[2])


async def run_to_end(loop: TrainingLoop, submit: Callable[[int], Awaitable[PendingStep]]) -> TrainResult:
    """:func:`run_pipelined`, then finish the run: its last checkpoint and every metrics line."""
    await run_pipelined(loop, submit)
    final = await loop.finish()
    return TrainResult(final=final, metrics=loop.run_dir.read_metrics())


def step_line(
    metrics: dict[str, float],
    optim_metrics: Mapping[str, float] | None,
    *,
    step: int,
    initial: Mapping[str, float],
    evaluated: Mapping[str, float],
) -> dict[str, float]:
    """A step's metrics line: the step's own ``metrics``, the optimizer's (as ``optim/…``), the
    run's ``initial`` evaluation on step 0, and the evaluation ``evaluated`` after this step."""
    metrics |= {f"optim/{k}": v for k, v in (optim_metrics or {}).items()}
    if step == 0:
        metrics |= initial
    return metrics | dict(evaluated)
