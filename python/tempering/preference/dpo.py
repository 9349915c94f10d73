"""Direct preference optimization (DPO) on labeled comparisons.

The reference model is the initial policy, and stays that for the whole run: before the first
step the initial weights are saved for sampling (``save_weights_for_sampler("reference")``) and
their path recorded in the run directory's ``state.json``; a resumed run samples its reference
logprobs from that same path (never from the checkpoint it resumed from).

Each step: the reference logprobs of the batch come from a sampling client of the reference
weights (``compute_logprobs``, requested one step ahead), then one
``forward_backward_custom`` with the DPO loss and one ``optim_step``, queued before the
previous step's results are read. Everything runs on one event loop.

Loss, per pair, with ``Δ = beta * ((log π(c) - log π_ref(c)) - (log π(r) - log π_ref(r)))``
(log-probabilities summed over the completion's tokens): ``-log σ(Δ)``; the batch loss is the
mean over pairs.

Shapes: ``data_D`` interleaves pairs (chosen at even ``d``, rejected at odd); ``ref_D`` the
reference log-probability of each datum's trained tokens; ``weights_T`` a datum's weights.

Example::

    config = DPOConfig(run=RunConfig(log_dir="runs/dpo"), beta=0.1)
    result = asyncio.run(config())       # or: tempering dpo --run.log-dir runs/dpo
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import tinker
import torch

from tempering.backend import ServiceClient
from tempering.backends import require
from tempering.evals.suite import EvalSuite
from tempering.preference.data import ComparisonData, pair_datums, reference_input
from tempering.renderers import get_renderer
from tempering.training import FineTuningConfig, PendingStep, TrainingLoop, TrainResult
from tempering.training.loop import run_to_end, step_line
from tempering_protocols import (
    ComparisonDataset,
    Future,
    LabeledComparison,
    Renderer,
    SamplingClient,
    TrainingClient,
)

__all__ = ["DPOConfig", "DPOEvaluator", "dpo_loss", "reference_logprobs"]

_TIE = 1e-4
"""|Δ / beta| below this (nats) counts as a tie: half right (the policy equals the reference)."""


def _weights(data_D: Sequence[tinker.Datum]) -> list[npt.NDArray[np.float32]]:
    return [d.loss_fn_inputs["weights"].to_numpy().astype(np.float32) for d in data_D]


def reference_logprobs(
    sampler: SamplingClient, data_D: Sequence[tinker.Datum]
) -> list[Future[list[float | None]]]:
    """Queue ``compute_logprobs`` of each datum's sequence on the reference sampler."""
    return [sampler.compute_logprobs(reference_input(d)) for d in data_D]


async def _ref_D(
    futures: Sequence[Future[list[float | None]]], weights_D: Sequence[npt.NDArray[np.float32]]
) -> npt.NDArray[np.float64]:
    """``ref_D``: the weighted sum of each datum's reference logprobs of its targets."""
    out = np.zeros(len(futures))
    for d, (future, weights_T) in enumerate(zip(futures, weights_D, strict=True)):
        logprobs = (await future)[1:]  # position t predicts token t + 1, like the datum's targets
        lp_T = np.asarray([0.0 if x is None else x for x in logprobs], dtype=np.float64)
        out[d] = float(lp_T @ weights_T.astype(np.float64))
    return out


def _pair_metrics(delta_P: npt.NDArray[np.float64], beta: float) -> dict[str, float]:
    right = np.where(np.abs(delta_P) < _TIE * beta, 0.5, (delta_P > 0).astype(np.float64))
    return {"accuracy": float(right.mean()), "margin": float(delta_P.mean())}


def dpo_loss(
    ref_D: npt.NDArray[np.float64], weights_D: Sequence[npt.NDArray[np.float32]], beta: float
) -> Any:
    """The custom loss for ``forward_backward_custom``: ``(data_D, logprobs_D) -> (loss, metrics)``.

    Metrics: ``dpo/loss``, ``dpo/accuracy`` (pairs with Δ > 0, ties half), ``dpo/chosen_reward``
    and ``dpo/rejected_reward`` (``beta * (log π - log π_ref)``, means), ``dpo/margin`` (mean Δ).
    """
    ref_t = torch.as_tensor(ref_D, dtype=torch.float32)
    weights_t = [torch.as_tensor(w) for w in weights_D]

    def loss_fn(
        data: list[tinker.Datum], logprobs_D: list[torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        del data
        policy_D = torch.stack([(lp * w).sum() for lp, w in zip(logprobs_D, weights_t, strict=True)])
        ratio_D = policy_D - ref_t
        chosen_P, rejected_P = beta * ratio_D[0::2], beta * ratio_D[1::2]
        delta_P = chosen_P - rejected_P
        loss = -torch.nn.functional.logsigmoid(delta_P).mean()
        pair = _pair_metrics(delta_P.detach().double().numpy(), beta)
        return loss, {
            "dpo/loss": float(loss.detach()),
            "dpo/accuracy": pair["accuracy"],
            "dpo/chosen_reward": float(chosen_P.detach().mean()),
            "dpo/rejected_reward": float(rejected_P.detach().mean()),
            "dpo/margin": pair["margin"],
        }

    return loss_fn


@attrs.define
class DPOEvaluator:
    """Held-out DPO metrics: ``test/dpo_loss``, ``test/dpo_accuracy`` (Δ > 0, ties half: 0.5
    for the initial policy), and ``test/policy_accuracy`` (the policy alone gives the chosen
    completion the higher log-probability). The reference logprobs are computed once.

    Example::

        metrics = await DPOEvaluator(pairs, renderer, reference_sampler, beta=0.1)(training_client)
    """

    pairs: Sequence[LabeledComparison]
    renderer: Renderer
    reference: SamplingClient
    beta: float
    max_length: int | None = None
    _data_D: list[tinker.Datum] | None = None
    _ref_D: npt.NDArray[np.float64] | None = None

    async def __call__(self, training_client: TrainingClient, /) -> dict[str, float]:
        if self._data_D is None:
            self._data_D = pair_datums(self.renderer, self.pairs, self.max_length)
        data_D = self._data_D
        weights_D = _weights(data_D)
        if self._ref_D is None:
            self._ref_D = await _ref_D(reference_logprobs(self.reference, data_D), weights_D)
        out = await training_client.forward(data_D, "cross_entropy")
        policy_D = np.asarray(
            [
                float(o["logprobs"].to_numpy().astype(np.float64) @ w.astype(np.float64))
                for o, w in zip(out.loss_fn_outputs, weights_D, strict=True)
            ]
        )
        ratio_D = self.beta * (policy_D - self._ref_D)
        delta_P = ratio_D[0::2] - ratio_D[1::2]
        loss = float(np.mean(np.logaddexp(0.0, -delta_P)))
        return {
            "test/dpo_loss": loss,
            "test/dpo_accuracy": _pair_metrics(delta_P, self.beta)["accuracy"],
            "test/policy_accuracy": float(np.mean(policy_D[0::2] > policy_D[1::2])),
        }


@attrs.frozen(kw_only=True)
class DPOConfig(FineTuningConfig):
    """A DPO run. Picklable; calling it (``await config()``) runs it. See the module docstring.
    The settings besides ``data``, ``beta`` and ``evals`` are
    :class:`~tempering.training.FineTuningConfig`'s; an epoch passes over the training pairs.

    Example::

        result = asyncio.run(DPOConfig(run=RunConfig(log_dir="runs/dpo"), beta=0.1, max_steps=30)())
    """

    data: ComparisonData = attrs.field(factory=ComparisonData)
    beta: float = 0.1
    """DPO's inverse temperature: how far the policy may move from the reference."""
    evals: EvalSuite = attrs.field(factory=EvalSuite)
    """Benchmarks run on the sampler weights with the held-out pairs (before the first step,
    every ``run.eval_every`` steps, after the last), e.g. ``--evals.benchmarks
    inspect:tasks.py@my_task``; docs/evals.md."""

    async def __call__(self, service: ServiceClient | None = None) -> TrainResult:
        return await _train_dpo(self, service)


async def _reference_sampler(loop: TrainingLoop) -> SamplingClient:
    """The initial policy's weights, saved once per run and reused by every resume."""
    path = loop.run_dir.read_state().get("reference_path")
    if path is None:
        if loop.start_step != 0:
            raise RuntimeError(f"{loop.path}: the run has checkpoints but no recorded reference weights")
        path = (await loop.client.save_weights_for_sampler("reference")).path
        loop.run_dir.update_state(reference_path=path)
    return await loop.service.create_sampling_client(model_path=str(path))


def _all_pairs(dataset: ComparisonDataset) -> list[LabeledComparison]:
    """Every pair of a held-out dataset (a user's builder's ``ComparisonDataset`` too)."""
    items = getattr(dataset, "items", None)
    if items is not None:
        return list(items)
    return [pair for i in range(len(dataset)) for pair in dataset.get_batch(i)]


async def _train_dpo(config: DPOConfig, service: ServiceClient | None) -> TrainResult:
    config = config.resolved("dpo")
    train, test = config.data()
    suite = config.evals.build(config.model, log_dir=config.run.log_dir)
    batches_per_epoch = len(train)
    total_steps = config.num_epochs * batches_per_epoch
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    loop = await TrainingLoop.open(
        config.run,
        config.model,
        config,
        total_steps=total_steps,
        batches_per_epoch=batches_per_epoch,
        service=service,
    )
    async with loop:  # closes the sinks and the bar on error too
        require(loop.client, "custom_loss", "DPO (its loss goes through forward_backward_custom)")
        renderer = get_renderer(config.model.renderer(), loop.client.get_tokenizer())
        reference = await _reference_sampler(loop)
        make_data = functools.partial(
            pair_datums, renderer, max_length=getattr(config.data, "max_length", None)
        )
        held_out = [] if test is None else [DPOEvaluator(_all_pairs(test), renderer, reference, config.beta)]
        initial: dict[str, float] = {}
        if (held_out or suite) and loop.start_step == 0:
            initial = {f"initial/{k}": v for k, v in (await loop.evaluate(held_out, suite)).items()}

        prepared: dict[int, tuple[list[tinker.Datum], list[Future[list[float | None]]]]] = {}
        epochs: dict[int, int] = {}

        def prepare(step: int, source: ComparisonDataset) -> None:
            """Build step's datums and queue their reference logprobs (one step ahead)."""
            if step >= total_steps or step in prepared:
                return
            epoch, index = loop.position(step)
            if epochs.get(id(source)) != epoch:  # any ComparisonDataset (a user's builder's too)
                source.set_epoch(epoch)
                epochs[id(source)] = epoch
            data_D = make_data(source.get_batch(index))
            prepared[step] = (data_D, reference_logprobs(reference, data_D))

        async def submit(step: int) -> PendingStep:
            t0 = time.monotonic()
            prepare(step, train)
            data_D, ref_futures = prepared.pop(step)
            prepare(step + 1, train)
            weights_D = _weights(data_D)
            ref_D = await _ref_D(ref_futures, weights_D)
            params = config.adam.adam_params(step, total_steps)
            t_data = time.monotonic() - t0
            fb = loop.client.forward_backward_custom(data_D, dpo_loss(ref_D, weights_D, config.beta))
            opt = loop.client.optim_step(params)
            evaluated: dict[str, float] = {}
            if (held_out or suite) and loop.eval_due(step + 1):
                evaluated = await loop.evaluate(held_out, suite)

            async def finish() -> Mapping[str, float]:
                fb_out, opt_out = await fb, await opt
                metrics = {k: v for k, v in fb_out.metrics.items() if k.startswith("dpo/")}
                metrics |= {
                    "loss": fb_out.metrics["dpo/loss"],
                    "lr": params.learning_rate,
                    "tokens": float(sum(d.model_input.length for d in data_D)),
                    "pairs": float(len(data_D) // 2),
                    "time/data": t_data,
                }
                return step_line(metrics, opt_out.metrics, step=step, initial=initial, evaluated=evaluated)

            return finish

        return await run_to_end(loop, submit)
