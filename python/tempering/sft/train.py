"""Supervised fine-tuning: batches of datums, cross-entropy, AdamW with a schedule, held-out NLL.

One loop serves every supervised recipe: :func:`train_supervised` takes any
``SupervisedDataset`` (chat SFT here, the pairwise reward model in
``tempering.preference.reward_model``), and the run bookkeeping (client, run directory,
checkpoints, exact resume, metrics) is :class:`tempering.training.TrainingLoop`'s.

Shapes: ``data_D`` the datums of a batch; ``weights_T`` one datum's per-target weights.

Example::

    config = SFTConfig(run=RunConfig(log_dir="runs/sft"), data=ChatData(batch_size=16))
    result = asyncio.run(config())   # or: tempering sft --run.log-dir runs/sft
    result.metrics[-1]["test/nll"]
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence

import attrs
import tinker

from tempering.assets import ASSET_PREFIX, resolve_data_path
from tempering.backend import ModelConfig, ServiceClient, load_tokenizer
from tempering.data import ChatDatasetBuilder, ChatSource, check_max_length
from tempering.data.datums import examples_to_datums
from tempering.evals.suite import EvalSuite
from tempering.model_info import Stage
from tempering.training import AdamConfig, FineTuningConfig, PendingStep, RunConfig, TrainingLoop, TrainResult
from tempering.training.loop import run_to_end, step_line
from tempering_protocols import (
    SamplingClientEvaluator,
    SupervisedDataset,
    SupervisedDatasetBuilder,
    TrainingClient,
    TrainingClientEvaluator,
    TrainOnWhat,
)

__all__ = [
    "ChatData",
    "NLLEvaluator",
    "SFTConfig",
    "train_supervised",
]


def _weight_sum(data_D: Sequence[tinker.Datum]) -> float:
    return float(sum(float(d.loss_fn_inputs["weights"].to_numpy().sum()) for d in data_D))


def _token_count(data_D: Sequence[tinker.Datum]) -> int:
    return sum(d.model_input.length for d in data_D)


@attrs.frozen
class NLLEvaluator:
    """Mean negative log-likelihood per trained token of a held-out dataset (``test/nll``).

    Runs ``forward`` (no gradients) over every batch of ``dataset`` (epoch 0). Satisfies
    ``TrainingClientEvaluator``.

    Example::

        metrics = await NLLEvaluator(test_ds)(training_client)   # {"test/nll": 1.93}
    """

    dataset: SupervisedDataset
    name: str = "test"

    async def __call__(self, training_client: TrainingClient, /) -> dict[str, float]:
        self.dataset.set_epoch(0)
        batches = [list(self.dataset.get_batch(i)) for i in range(len(self.dataset))]
        futures = [training_client.forward(data_D, "cross_entropy") for data_D in batches]
        total = 0.0
        for future in futures:
            total += (await future).metrics["loss:sum"]
        weight = sum(_weight_sum(data_D) for data_D in batches)
        return {f"{self.name}/nll": total / max(weight, 1e-9)}


async def train_supervised(
    config: object,
    *,
    run: RunConfig,
    model: ModelConfig,
    adam: AdamConfig,
    train: SupervisedDataset,
    num_epochs: int = 1,
    max_steps: int | None = None,
    training_evaluators: Sequence[TrainingClientEvaluator] = (),
    sampling_evaluators: Sequence[SamplingClientEvaluator] = (),
    service: ServiceClient | None = None,
    stage: Stage = "sft",
) -> TrainResult:
    """Train on ``train`` with cross-entropy, ``num_epochs`` epochs (at most ``max_steps`` steps).

    Each step is one batch: ``forward_backward`` then ``optim_step``, queued together; the next
    step is queued before this one's results are read. The evaluators run before the first
    step (``initial/…`` in step 0's line), every ``run.eval_every`` steps and after the last
    (their metrics join that step's line); at those steps the pipeline waits for the evaluation.
    ``config`` is what ``config.json`` records.

    Metrics: ``loss`` (train NLL per trained token, before the step's update), ``lr``,
    ``tokens``, ``tokens/trained``, ``optim/grad_norm``, the evaluators', ``time/…``.
    """
    adam = adam.for_model(model.base_model, stage, lora=model.lora_rank > 0)
    batches_per_epoch = len(train)
    total_steps = num_epochs * batches_per_epoch
    if max_steps is not None:
        total_steps = min(total_steps, max_steps)
    loop = await TrainingLoop.open(
        run, model, config, total_steps=total_steps, batches_per_epoch=batches_per_epoch, service=service
    )
    async with loop:  # closes the sinks and the bar on error too
        client = loop.client
        initial: dict[str, float] = {}
        if loop.start_step == 0 and (training_evaluators or sampling_evaluators):
            evaluated = await loop.evaluate(training_evaluators, sampling_evaluators)
            initial = {f"initial/{k}": v for k, v in evaluated.items()}
        current_epoch = -1

        async def submit(step: int) -> PendingStep:
            nonlocal current_epoch
            t0 = time.monotonic()
            epoch, index = loop.position(step)
            if epoch != current_epoch:
                train.set_epoch(epoch)
                current_epoch = epoch
            data_D = list(train.get_batch(index))
            weight = _weight_sum(data_D)
            params = adam.adam_params(step, total_steps)
            t_data = time.monotonic() - t0
            fb = client.forward_backward(data_D, "cross_entropy")
            opt = client.optim_step(params)
            evaluated: dict[str, float] = {}
            if (training_evaluators or sampling_evaluators) and loop.eval_due(step + 1):
                t_eval = time.monotonic()
                evaluated = await loop.evaluate(training_evaluators, sampling_evaluators)
                evaluated["time/eval"] = time.monotonic() - t_eval

            async def finish() -> Mapping[str, float]:
                fb_out, opt_out = await fb, await opt
                metrics: dict[str, float] = {
                    "loss": fb_out.metrics["loss:sum"] / max(weight, 1e-9),
                    "lr": params.learning_rate,
                    "tokens": float(_token_count(data_D)),
                    "tokens/trained": weight,
                    "time/data": t_data,
                }
                return step_line(metrics, opt_out.metrics, step=step, initial=initial, evaluated=evaluated)

            return finish

        return await run_to_end(loop, submit)


@attrs.frozen(kw_only=True)
class ChatData:
    """Chat conversations for SFT: a JSONL/JSON/Parquet/Arrow file of ``{"messages": [...]}``.

    ``test_path``: held-out conversations (plus ``test_size`` drawn from ``path``); paths may
    name shipped files as ``tempering-assets:<name>``. ``max_length``: truncate datums to this
    many tokens. Calling it with the model builds a picklable ``ChatDatasetBuilder``.
    """

    path: str = ASSET_PREFIX + "arithmetic_chat.jsonl"
    """Training conversations: a file, ``hf:NAME[:split]`` or ``tempering-assets:<name>``."""
    test_path: str | None = ASSET_PREFIX + "arithmetic_chat_test.jsonl"
    """Held-out conversations (NLL evaluation); ``None``: none."""
    test_size: int = 0
    """Conversations drawn from ``path`` and held out as well."""
    batch_size: int = 16
    """Conversations per optimizer step."""
    max_length: int | None = attrs.field(default=None, validator=check_max_length)
    """Truncate each datum to this many tokens; ``None``: no limit."""
    train_on_what: TrainOnWhat = attrs.field(
        default=TrainOnWhat.LAST_ASSISTANT_MESSAGE, converter=TrainOnWhat
    )
    """Also given as a string or the Tinker Cookbook's ``TrainOnWhat`` (same values)."""
    seed: int = 0
    """Seeds the held-out draw and the batch order."""
    columns: str | None = None
    """Column mapping of ``hf:NAME[:split]`` paths, e.g. ``prompt=question,completion=answer``
    (docs/datasets.md)."""
    streaming: bool = False
    """Read ``path`` as a stream (``datasets`` ``streaming=True`` for ``hf:``): the trainer
    renders each batch as it needs it; an epoch is ``stream_batches`` batches."""
    stream_batches: int = 1000
    """With ``streaming``: batches per epoch."""

    def __call__(self, model: ModelConfig) -> SupervisedDatasetBuilder:
        tests = (
            ()
            if self.test_path is None
            else (ChatSource(resolve_data_path(self.test_path), columns=self.columns),)
        )
        sources = (ChatSource(resolve_data_path(self.path), columns=self.columns),)
        tokenizer = functools.partial(load_tokenizer, model.base_model)
        to_datums = functools.partial(examples_to_datums, max_length=self.max_length)
        if self.streaming:
            from tempering.data.streaming import StreamingChatDatasetBuilder

            return StreamingChatDatasetBuilder(
                sources=sources,
                tokenizer=tokenizer,
                renderer_name=model.renderer(),
                batch_size=self.batch_size,
                batches_per_epoch=self.stream_batches,
                to_datums=to_datums,
                train_on_what=self.train_on_what,
                test_sources=tests,
                seed=self.seed,
            )
        return ChatDatasetBuilder(
            sources=sources,
            tokenizer=tokenizer,
            renderer_name=model.renderer(),
            batch_size=self.batch_size,
            to_datums=to_datums,
            train_on_what=self.train_on_what,
            test_sources=tests,
            test_size=self.test_size,
            seed=self.seed,
        )


@attrs.frozen(kw_only=True)
class SFTConfig(FineTuningConfig):
    """A supervised fine-tuning run. Picklable; calling it (``await config()``) runs it. The
    settings besides ``data`` and ``evals`` are :class:`~tempering.training.FineTuningConfig`'s.

    Example::

        config = SFTConfig(run=RunConfig(log_dir="runs/sft"), max_steps=50)
        result = asyncio.run(config())
    """

    data: ChatData = attrs.field(factory=ChatData)
    evals: EvalSuite = attrs.field(factory=EvalSuite)
    """Benchmarks run on the sampler weights with the held-out NLL (before the first step, every
    ``run.eval_every`` steps, after the last), e.g. ``--evals.benchmarks gsm8k``; docs/evals.md."""

    async def __call__(self, service: ServiceClient | None = None) -> TrainResult:
        config = self.resolved("sft")
        train, test = self.data(self.model)()
        return await train_supervised(
            config,
            run=self.run,
            model=self.model,
            adam=config.adam,
            train=train,
            num_epochs=self.num_epochs,
            max_steps=self.max_steps,
            training_evaluators=[NLLEvaluator(test)] if test is not None else [],
            sampling_evaluators=self.evals.build(self.model, log_dir=self.run.log_dir),
            service=service,
        )
