"""The RL training loop: one loop, three schedules.

Shapes (docs/notation.md): ``P`` groups of a batch, ``G`` members of a group, ``D`` datums,
``N`` token positions of a minibatch, ``S`` optimizer substeps of a step.

Every step ``s`` takes ``P`` scored groups, splits them into ``S = num_substeps`` minibatches and,
for each, computes advantages on the Rust core (constant-reward groups dropped and counted, except
with a distillation teacher, whose per-token signal they still carry), packs datums, adds the
per-token shaping terms (a distillation term from a teacher, a KL penalty against a reference
policy: :mod:`tempering.rl.shaping`) and queues ``forward_backward`` (or, with
``RLConfig.custom_loss``, ``forward_backward_custom``) + ``optim_step``. Where the groups come from is
the schedule (``sync``, ``streaming`` or ``async``; the table is in :mod:`tempering.rl.schedules`).

Seeding: with ``RLConfig.seed`` (default 0) every sampling request is seeded from the run's seed
and its place in the run: group ``p`` of step ``s`` (resampled ``r`` times) samples with group
seed ``sampling_seed(seed, "train", s, p, r)``, from which each member's, turn's and retry's
request seed derives (:func:`~tempering.rl.rollouts.rollout_group`); the evaluation after step
``s`` uses ``sampling_seed(seed, "test", s + 1, i)`` for test batch ``i``. The seeds do not
depend on the order in which requests complete, so ``sync`` and ``streaming`` runs (and a resumed
run) repeat their samples; ``async`` repeats each group's samples given the weights it was
sampled with, but which weights those are depends on timing.

Bookkeeping (run directory, ``metrics.jsonl``, checkpoints, exact resume, LR schedule, progress
bar) is :mod:`tempering.training`'s: this module supplies what one step submits. Periodic
checkpoints save sampler weights too (their ``sampler_path`` is in ``checkpoints.jsonl``, so any
checkpointed step can be sampled, and a resumed run samples its first step from it);
``RunConfig(save_sampler_weights=False)`` turns that off. The metrics logged per step are
listed in :mod:`tempering.rl.metrics`.

Example::

    config = RLConfig(run=RunConfig(log_dir="/tmp/rl"), dataset=LowercaseTask(), max_tokens=8)
    result = asyncio.run(config())      # or: await train(config)
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Literal, TypeAlias

import attrs
import numpy as np

from tempering.backend import ModelConfig, ServiceClient
from tempering.evals.suite import EvalSuite
from tempering.losses import RLLossName
from tempering.policy import bind_policy
from tempering.rl.batch_policy import BatchPolicy, BatchShaper, refill_rollouts
from tempering.rl.data import (
    Baseline,
    compute_advantages,
    remove_constant_reward_groups,
    trajectories_to_batch,
)
from tempering.rl.executor_factory import executor_metrics, make_executor
from tempering.rl.executors import RolloutExecutor
from tempering.rl.importance import ImportanceCorrection, correct_importance
from tempering.rl.loss_inputs import loss_datums
from tempering.rl.metrics import Substep, Timers, rollout_metrics, substep_metrics
from tempering.rl.policy import TinkerTokenCompleter, sampling_seed
from tempering.rl.rollouts import (
    GroupRollout,
    RolloutConfig,
    RolloutLimits,
    raise_if_every_rollout_failed,
    rollout_group,
    warn_if_nothing_to_learn,
)
from tempering.rl.schedules import AsyncGroups, as_completed, in_order
from tempering.rl.shaping import TokenTerm, open_terms, shape_advantages
from tempering.rl.test_set import evaluate_test_set
from tempering.rl.trajectories import StepLog, TrajectoryLog
from tempering.training.loop import PendingStep, RunConfig, TrainingLoop, TrainResult, run_pipelined
from tempering.training.schedule import AdamConfig
from tempering_protocols import (
    CustomLossFn,
    EnvGroupBuilder,
    RLDataset,
    RLDatasetBuilder,
    SamplingClient,
    TrajectoryGroup,
)

__all__ = [
    "RLConfig",
    "Schedule",
    "rollout_metrics",
    "train",
]

Schedule: TypeAlias = Literal["sync", "streaming", "async"]
StalePolicy: TypeAlias = Literal["drop", "resample"]


@attrs.frozen(kw_only=True)
class RLConfig:
    """Everything an RL run needs; picklable and JSON-recorded (``config.json``).

    Awaiting a call of the config runs the training (``await config()`` is ``await train(config)``).

    Example::

        RLConfig(run=RunConfig(log_dir="runs/rl"), dataset=ArithmeticTask(group_size=16),
                 adam=AdamConfig(learning_rate=4e-5), loss_fn="ppo", schedule="streaming",
                 num_substeps=4, max_tokens=256)
    """

    run: RunConfig
    dataset: RLDatasetBuilder
    model: ModelConfig = attrs.field(factory=ModelConfig)
    adam: AdamConfig = attrs.field(factory=AdamConfig)
    num_steps: int | None = None
    """Training steps (batches); default: one pass over the train dataset."""
    max_tokens: int = 64
    """Tokens per sampled turn."""
    temperature: float = 1.0
    """Sampling temperature of every rollout turn."""
    loss_fn: RLLossName = "importance_sampling"
    """The policy-gradient loss (docs/rl.md, Losses; the names: :data:`tempering.losses.LOSSES`)."""
    loss_fn_config: Mapping[str, float] | None = None
    """The loss's settings (clip thresholds, beta, kl_coeff); ``None``: its defaults."""
    custom_loss: CustomLossFn | None = None
    """A client-side loss ``(data_D, logprobs_D) -> (loss, metrics)`` trained with
    ``forward_backward_custom`` instead of ``loss_fn``; its datums carry every input (``logprobs``,
    ``advantages``, ``mask``), its metrics are logged as named (docs/rl.md, Custom losses)."""
    normalize_advantages: bool = False
    """Divide each group's advantages by their standard deviation."""
    baseline: Baseline = "mean"
    """A member's advantage is its reward minus the group's mean, or the others' mean (``loo``)."""
    schedule: Schedule = "sync"
    """When sampled groups train: ``sync``, ``streaming`` or ``async`` (docs/rl.md)."""
    num_substeps: int = 1
    """Optimizer steps per batch, each on its share of the batch's groups."""
    max_steps_off_policy: int = 1
    """With ``schedule=async``: how many steps older than the trained weights a group may be."""
    stale_policy: StalePolicy = "drop"
    """With ``schedule=async``: drop a group older than that, or sample it again."""
    rollout: RolloutConfig = attrs.field(factory=RolloutConfig)
    batch: BatchPolicy = attrs.field(factory=BatchPolicy)
    """Dynamic sampling and overlong filtering/shaping (rl/batch_policy.py)."""
    importance: ImportanceCorrection = attrs.field(factory=ImportanceCorrection)
    """Truncated/masked importance-sampling correction (rl/importance.py); ``off`` by default."""
    kl_penalty_coef: float = 0.0
    """Weight of the per-token KL penalty against ``kl_reference`` (0: off)."""
    kl_reference: str | None = None
    """Sampler weights path of the KL reference; ``None``: the base model."""
    distill_teacher: str | None = None
    """Sampler weights path of a teacher for on-policy distillation (``None``: off)."""
    distill_teachers: Mapping[str, str] | None = None
    """Logging tag (an interleaved dataset's source name) → teacher path: one teacher per dataset."""
    distill_coef: float = 1.0
    """Weight of the teacher's per-token reverse KL in the advantage."""
    env_workers: int = 0
    """0: env work in the event loop; ``n > 0``: in ``n`` worker processes."""
    ray_workers: int = 0
    """``n > 0``: env work in ``n`` Ray actors (:class:`~tempering.rl.ray_executor.RayExecutor`;
    ``pip install 'tempering[ray]'``); overrides ``env_workers``."""
    ray_address: str | None = None
    """With ``ray_workers``: the cluster to join (``auto``, ``ray://host:10001``); ``None``
    starts a local Ray unless one is running."""
    seed: int | None = 0
    """The run's sampling seed: every request's ``SamplingParams.seed`` derives from it and the
    request's place in the run (step, group, member, turn, retry, resample), so a run, and a
    resumed run, repeats its samples; ``None``: unseeded."""
    log_trajectories: bool = False
    """Write every step's rollouts (every group, member and turn) under
    ``<log_dir>/trajectories/``: Parquet (``rl/step-NNNNNN.parquet``, one row per transition)
    and decoded text (``text/step-NNNNNN.jsonl``, one line per episode); see
    :mod:`tempering.rl.trajectories`."""
    evals: EvalSuite = attrs.field(factory=EvalSuite)
    """Benchmarks run on the newest sampler weights with the test set, every ``run.eval_every``
    steps, e.g. ``--evals.benchmarks gsm8k --evals.limit 50``; docs/evals.md."""

    def __attrs_post_init__(self) -> None:
        if self.num_substeps < 1:
            raise ValueError(f"num_substeps must be >= 1, got {self.num_substeps}")
        if self.max_steps_off_policy < 0:
            raise ValueError(f"max_steps_off_policy must be >= 0, got {self.max_steps_off_policy}")
        self.batch.check_schedule(self.schedule)
        if self.custom_loss is not None and self.loss_fn_config is not None:
            raise ValueError(
                "loss_fn_config configures the built-in loss_fn, which custom_loss replaces: "
                "drop loss_fn_config and give the custom loss its settings itself"
            )
        for key, value in (self.loss_fn_config or {}).items():
            if not math.isfinite(value):
                raise ValueError(f"loss_fn_config[{key!r}] must be a finite number, got {value}")

    async def __call__(self, service: ServiceClient | None = None) -> TrainResult:
        return await train(self, service=service)


# ------------------------------------------------------------------------------ the run


class _Run:
    """The state of one run, complete once constructed: the loop, the datasets, the current
    policy, the shaping terms, the trajectory log, the async producer."""

    def __init__(
        self,
        config: RLConfig,
        loop: TrainingLoop,
        datasets: tuple[RLDataset, RLDataset | None],
        executor: RolloutExecutor,
        sampler: SamplingClient,
        terms: Sequence[TokenTerm],
        trajectory_log: TrajectoryLog | None,
    ) -> None:
        self.config = config
        self.loop = loop
        self.train_ds, self.test_ds = datasets
        self.executor = executor
        self.limits = RolloutLimits.from_config(config.rollout)
        self.policy = self._policy(sampler, loop.start_step)
        self.terms = terms
        """The per-token shaping terms (rl/shaping.py), applied in order."""
        self.keep_constant = any(t.keeps_constant_groups for t in terms)
        """Whether constant-reward groups train (a term teaches without reward variance)."""
        self.trajectory_log = trajectory_log
        """The trajectory log's writer (``RLConfig.log_trajectories``)."""
        self.async_groups = AsyncGroups(
            self._prepare_rollout,
            self.batch,
            max_steps_off_policy=config.max_steps_off_policy,
            stale_policy=config.stale_policy,
            steps=range(loop.start_step, loop.total_steps),
        )
        """The async schedule's producer and queue (rl/schedules.py); idle in the others."""
        self.evaluators = config.evals.build(config.model, log_dir=config.run.log_dir)
        """``RLConfig.evals``' evaluators, run with the test set."""
        self.shaper = BatchShaper(config.batch, config.max_tokens)

    def _policy(self, client: SamplingClient, version: int) -> TinkerTokenCompleter:
        return TinkerTokenCompleter(client, self.config.max_tokens, self.config.temperature, version)

    def batch(self, step: int) -> Sequence[EnvGroupBuilder]:
        return self.train_ds.get_batch(step % len(self.train_ds))

    def group_seed(self, step: int, index: int, resample: int = 0) -> int | None:
        """The sampling seed of group ``index`` of step ``step``'s batch, resampled ``resample`` times."""
        seed = self.config.seed
        return None if seed is None else sampling_seed(seed, "train", step, index, resample)

    # -------------------------------------------------------------- where groups come from

    async def minibatches(self, step: int, timers: Timers) -> AsyncIterator[list[GroupRollout]]:
        config = self.config
        t0 = time.perf_counter()
        if config.schedule == "async":
            source = self.async_groups.groups(step)
            n_groups = len(self.batch(step))
        else:
            builders = self.batch(step)
            n_groups = len(builders)
            policy = self.policy
            tasks = [
                asyncio.ensure_future(
                    rollout_group(
                        b,
                        policy,
                        config.rollout,
                        limits=self.limits,
                        executor=self.executor,
                        index=p,
                        seed=self.group_seed(step, p),
                    )
                )
                for p, b in enumerate(builders)
            ]
            source = in_order(tasks) if config.schedule == "sync" else as_completed(tasks)
            if config.batch.dynamic_sampling:  # the step's groups, then refills of zero-variance ones
                refill = refill_rollouts(self.batch, step, n_groups, policy, config.rollout,
                    limits=self.limits, executor=self.executor, seed=config.seed)  # fmt: skip
                source, n_groups = self.shaper.source(tasks, refill), -n_groups
        size = math.ceil(abs(n_groups) / config.num_substeps)  # n_groups < 0: until the source ends
        chunk: list[GroupRollout] = []
        collected = 0
        async for rollout in source:
            chunk.append(rollout)
            collected += 1
            if len(chunk) == size or collected == n_groups:
                timers.add("rollout", time.perf_counter() - t0)
                yield chunk
                chunk = []
                t0 = time.perf_counter()
                if collected == n_groups:
                    return
        if chunk:
            timers.add("rollout", time.perf_counter() - t0)
            yield chunk

    def _prepare_rollout(
        self, builder: EnvGroupBuilder, batch: int, index: int, resample: int
    ) -> Callable[[], Awaitable[GroupRollout]]:
        """Group ``index`` of step ``batch``'s batch with the newest weights (the async schedule)."""
        policy = self.policy
        seed = self.group_seed(batch, index, resample)

        def run() -> Awaitable[GroupRollout]:
            return rollout_group(
                builder,
                policy,
                self.config.rollout,
                limits=self.limits,
                executor=self.executor,
                index=index,
                seed=seed,
            )

        return run

    # -------------------------------------------------------------- one step

    async def _train_minibatch(
        self, groups: list[TrajectoryGroup], tags_P: list[list[str]], step: int, timers: Timers
    ) -> tuple[Substep | None, int]:
        """The minibatch's substep (``None``: nothing to train) and how many constant-reward
        groups it dropped (none when a shaping term keeps them)."""
        config = self.config
        t0 = time.perf_counter()
        groups = self.shaper.shape(groups)
        kept, n_constant = (list(groups), 0) if self.keep_constant else remove_constant_reward_groups(groups)
        if not kept:
            timers.add("data", time.perf_counter() - t0)
            return None, n_constant
        advantages_P = compute_advantages(
            kept, normalize_std=config.normalize_advantages, baseline=config.baseline
        )
        batch = trajectories_to_batch(kept, advantages_P)
        timers.add("data", time.perf_counter() - t0)
        t1 = time.perf_counter()
        batch, extra = await shape_advantages(batch, tags_P, self.terms)
        timers.add("wait", time.perf_counter() - t1)
        sampler_N = batch.logprobs_N  # the sampler's, for kl/sample_train_* (the correction replaces them)
        batch, is_metrics = await correct_importance(batch, self.loop.client, config.importance)
        t2, extra = time.perf_counter(), extra | is_metrics
        custom = config.custom_loss
        data_D = loss_datums(batch.to_datums(), config.loss_fn if custom is None else "custom")
        if not data_D:  # gspo: no trained token in the minibatch
            timers.add("train", time.perf_counter() - t2)
            return None, n_constant
        if custom is not None:
            fb = self.loop.client.forward_backward_custom(data_D, custom)
        else:
            cfg = dict(config.loss_fn_config) if config.loss_fn_config is not None else None
            fb = self.loop.client.forward_backward(data_D, config.loss_fn, cfg)
        params = config.adam.adam_params(step, self.loop.total_steps)
        opt = self.loop.client.optim_step(params)
        extra["optim/lr"] = params.learning_rate
        timers.add("train", time.perf_counter() - t2)
        return Substep(fb, opt, batch, extra, sampler_N), n_constant

    async def submit(self, step: int) -> PendingStep:
        config = self.config
        timers = Timers()
        used: list[GroupRollout] = []
        substeps: list[Substep] = []
        n_constant = 0
        stale_before = self.async_groups.stale.n_stale
        async for chunk in self.minibatches(step, timers):
            used += chunk
            groups = [r.group for r in chunk if r.group is not None]
            if not groups:
                continue
            tags_P = [list(r.tags) for r in chunk if r.group is not None]
            sub, dropped = await self._train_minibatch(groups, tags_P, step, timers)
            n_constant += dropped
            if sub is not None:
                substeps.append(sub)
        raise_if_every_rollout_failed(used, step)
        # The weights after this step sample the next one (queued behind its optim_step).
        self.policy = self._policy(await self.loop.sampling_client(), step + 1)
        await self.async_groups.submitted(step + 1)
        metrics = rollout_metrics(used) | executor_metrics(self.executor) | self.shaper.step_metrics(used)
        n_stale = self.async_groups.stale.n_stale - stale_before
        n_seen = len(used) + n_stale
        n_failed = sum(r.group is None for r in used)
        metrics["env/n_constant_reward_groups"] = float(n_constant)
        metrics["env/frac_groups_dropped"] = (n_constant + n_failed + n_stale) / n_seen if n_seen else 0.0
        metrics["optim/substeps"] = float(len(substeps))
        if config.schedule == "async":
            metrics["async/stale_groups"] = float(n_stale)
            versions = [step - r.version for r in used]
            metrics["async/mean_staleness"] = float(np.mean(versions)) if versions else 0.0
            metrics["async/max_staleness"] = float(max(versions)) if versions else 0.0
        metrics["time/sampling"] = sum(r.sampling_s for r in used)
        metrics["time/env"] = sum(r.env_s for r in used)
        # The step's trajectories are written in a thread while training runs; the metrics line
        # (written after ``finish``) comes after the step's complete part files.
        log_write: asyncio.Future[StepLog] | None = None
        if self.trajectory_log is not None:
            log_write = asyncio.ensure_future(asyncio.to_thread(self.trajectory_log.write_step, step, used))
        eval_metrics: dict[str, float] = {}
        if (self.test_ds is not None or self.evaluators) and self.loop.eval_due(step + 1):
            eval_metrics = await self.evaluate(step + 1)

        async def finish() -> Mapping[str, float]:
            t0 = time.perf_counter()
            out = metrics | await substep_metrics(substeps, loss_metrics=config.custom_loss is not None)
            if log_write is not None:
                out["time/log_trajectories"] = (await log_write).seconds
            timers.add("wait", time.perf_counter() - t0)
            out.update(timers.values)
            out.update(eval_metrics)
            return out

        return finish

    async def evaluate(self, after: int) -> dict[str, float]:
        """The test set and ``RLConfig.evals`` with the newest weights (rl/test_set.py)."""
        return await evaluate_test_set(self.test_ds, self.evaluators, self.policy, self.config.rollout,
            limits=self.limits, executor=self.executor, seed=self.config.seed, after=after)  # fmt: skip


async def train(config: RLConfig, *, service: ServiceClient | None = None) -> TrainResult:
    """Run (or resume) the RL training described by ``config``; see the module docstring.

    ``service``: a service client (default ``tempering.service_client()``).

    Example::

        result = await train(RLConfig(run=RunConfig(log_dir="runs/rl"), dataset=LowercaseTask()))
        result.metrics[-1]["env/reward/mean"]
    """
    model = config.model
    config = attrs.evolve(
        config, adam=config.adam.for_model(model.base_model, "rl", lora=model.lora_rank > 0)
    )
    dataset = bind_policy(config.dataset, model)  # the task renders with the policy's tokenizer
    group_size: object = getattr(dataset, "group_size", None)
    warn_if_nothing_to_learn(
        config.max_tokens, group_size, teacher=bool(config.distill_teacher or config.distill_teachers)
    )
    train_ds, test_ds = await dataset()
    total = config.num_steps if config.num_steps is not None else len(train_ds)
    loop = await TrainingLoop.open(
        config.run,
        config.model,
        config,
        total_steps=total,
        batches_per_epoch=len(train_ds),
        service=service,
        progress_keys=("env/reward/mean", "optim/lr"),
        sampler_weights_by_default=True,
    )
    async with loop:  # closes the metric sinks and the bar, on error too
        return await _train(config, loop, train_ds, test_ds)


async def _train(
    config: RLConfig, loop: TrainingLoop, train_ds: RLDataset, test_ds: RLDataset | None
) -> TrainResult:
    # On resume, the checkpoint's sampler weights (no extra save); else the current weights.
    sampler = await loop.initial_sampling_client()
    executor, pool = make_executor(config.env_workers, config.ray_workers, config.ray_address)
    lines_before = len(loop.run_dir.read_metrics())
    run: _Run | None = None
    try:
        terms = await open_terms(loop.service, base_model=config.model.base_model,
            kl_penalty_coef=config.kl_penalty_coef, kl_reference=config.kl_reference,
            distill_teacher=config.distill_teacher, distill_teachers=config.distill_teachers,
            distill_coef=config.distill_coef)  # fmt: skip
        log = None
        if config.log_trajectories:
            log = TrajectoryLog(loop.path / "trajectories", tokenizer=config.model.tokenizer(),
                baseline=config.baseline, normalize_std=config.normalize_advantages,
                keep_constant=any(t.keeps_constant_groups for t in terms))  # fmt: skip
            log.start(loop.start_step)  # the parts of the steps this process runs go
        run = _Run(config, loop, (train_ds, test_ds), executor, sampler, terms, log)
        if config.schedule == "async":
            run.async_groups.start()
        await run_pipelined(loop, run.submit)
        final = await loop.finish()
    finally:
        if run is not None:
            run.async_groups.cancel()
        if pool is not None:
            pool.close()
    return TrainResult(final=final, metrics=loop.run_dir.read_metrics()[lines_before:])
