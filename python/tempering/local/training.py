"""The local training client: forward/backward with the built-in or a custom loss, AdamW steps,
checkpoints, and sampling clients from the current weights.

Every method that does work returns a :class:`~tempering.local.futures.LocalFuture` at once and
runs on the client's own thread, in submission order. Gradients accumulate over
``forward_backward`` calls until ``optim_step`` applies and clears them. A request that fails
(a datum that doesn't fit its loss, an unknown checkpoint) raises through its future and leaves
the weights, gradients and optimizer as they were.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import tinker
import torch
from tinker import types as ttypes
from torch import nn
from transformers import PreTrainedTokenizerBase

from tempering.local.checkpoints import (
    CheckpointKind,
    CheckpointMeta,
    CheckpointStore,
    LoadedCheckpoint,
    LoraMeta,
)
from tempering.local.errors import IncompatibleCheckpointError
from tempering.local.forward import TrainingForward, per_datum_logprobs, resolve_checkpointing
from tempering.local.futures import LocalFuture, Worker, WorkerClient
from tempering.local.losses import CheckedDatum, check_data, get_loss, pad_batch, resolve_config
from tempering.local.microbatch import gradients_all_or_nothing, plan_microbatches, resolve_token_budget
from tempering.local.model import Placement, hf_model, sampling_copy, trainable_parameters
from tempering.local.sampling import LocalSamplingClient, SamplerModel
from tempering_protocols.backend import CustomLossFn

__all__ = ["LocalTrainingClient", "ModelSpec", "TrainingMemory"]

_OUTPUT_TYPE = "ArrayRecord"


@dataclass(frozen=True)
class ModelSpec:
    """Which model a client trains: the base model and the LoRA shape (None: full fine-tuning)."""

    base_model: str
    model_dir: Path
    lora: LoraMeta | None


@dataclass(frozen=True)
class TrainingMemory:
    """How a training client keeps within memory (:mod:`tempering.local.microbatch`).

    ``max_batch_tokens``: the most padded tokens in one micro-batch (None:
    ``$TEMPERING_MAX_BATCH_TOKENS``, else derived from memory). ``activation_checkpointing``:
    recompute the decoder layers in the backward pass (None: ``$TEMPERING_ACTIVATION_CHECKPOINTING``,
    else off)."""

    max_batch_tokens: int | None = None
    activation_checkpointing: bool | None = None


class LocalTrainingClient(WorkerClient):
    """Trains one model in-process. Satisfies ``tempering_protocols.TrainingClient`` with the
    official ``tinker`` types; get one from ``tempering.local.ServiceClient`` (built by
    :class:`~tempering.local.loader.ModelLoader`, whose ``sampler`` is ``load_sampler``: it
    builds the sampler model for a saved path in :meth:`create_sampling_client`).

    Requests are split into micro-batches under a token budget and the target logprobs are
    computed chunk by chunk over the vocabulary (``memory``: :class:`TrainingMemory`).

    Example::

        service = tempering.local.ServiceClient()
        client = service.create_lora_training_client("tempering/tiny", rank=8).result()
        fwd = client.forward_backward(data, "cross_entropy")
        opt = client.optim_step(tinker.AdamParams(learning_rate=1e-3))
        print(fwd.result().metrics["loss:sum"]); opt.result()
    """

    def __init__(
        self,
        model: nn.Module,
        spec: ModelSpec,
        placement: Placement,
        tokenizer: PreTrainedTokenizerBase,
        store: CheckpointStore,
        run_id: str | None = None,
        *,
        load_sampler: Callable[[str], SamplerModel],
        memory: TrainingMemory | None = None,
    ) -> None:
        self._model = model
        self._load_sampler = load_sampler
        self._spec = spec
        self._placement = placement
        self._tokenizer = tokenizer
        self._store = store
        self._run_id = run_id or store.new_run_id()
        self._params = trainable_parameters(model)
        self._optimizer: torch.optim.AdamW | None = None
        self._steps = 0
        self._worker = Worker("trainer")
        config = hf_model(model).config
        self._vocab_size = int(config.vocab_size)
        self._max_length = int(getattr(config, "max_position_embeddings", 0) or 1 << 20)
        self._arch = str(config.model_type)
        memory = memory or TrainingMemory()
        checkpointing = resolve_checkpointing(memory.activation_checkpointing)
        self._forward = TrainingForward(model, activation_checkpointing=checkpointing)
        self._budget = resolve_token_budget(
            memory.max_batch_tokens, config, placement, checkpointing=checkpointing
        )

    @property
    def checkpoint_store(self) -> CheckpointStore:
        """The store this client saves checkpoints in (``tempering://`` paths resolve there)."""
        return self._store

    # ---- forward / backward -----------------------------------------------------------------

    def forward(
        self,
        data: list[tinker.Datum],
        loss_fn: ttypes.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> LocalFuture[ttypes.ForwardBackwardOutput]:
        """Logprobs of the targets and the loss, without gradients."""
        data = list(data)
        return self._worker.submit(lambda: self._builtin(data, loss_fn, loss_fn_config, backward=False))

    def forward_backward(
        self,
        data: list[tinker.Datum],
        loss_fn: ttypes.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> LocalFuture[ttypes.ForwardBackwardOutput]:
        """Like :meth:`forward`, and add the loss's gradient to the accumulated gradients."""
        data = list(data)
        return self._worker.submit(lambda: self._builtin(data, loss_fn, loss_fn_config, backward=True))

    def forward_backward_custom(
        self, data: list[tinker.Datum], loss_fn: CustomLossFn
    ) -> LocalFuture[ttypes.ForwardBackwardOutput]:
        """Backpropagate a loss computed by ``loss_fn(data, logprobs_D) -> (loss, metrics)``.

        ``logprobs_D[d]`` is a float32 CPU tensor of the shape of datum ``d``'s
        ``target_tokens``, requiring grad, as the hosted service passes it. ``loss`` must be a
        scalar tensor; ``metrics`` values are floats. One forward pass serves both the loss and
        the backward (the hosted service needs two).
        """
        data = list(data)
        return self._worker.submit(lambda: self._custom(data, loss_fn))

    @staticmethod
    def _outputs(per_datum: list[torch.Tensor]) -> list[ttypes.LossFnOutput]:
        return [
            {"logprobs": tinker.TensorData.from_numpy(lp.detach().to("cpu", torch.float32).numpy())}
            for lp in per_datum
        ]

    def _check(self, data: list[tinker.Datum], loss_name: str | None) -> list[CheckedDatum]:
        loss = get_loss(loss_name) if loss_name is not None else None
        return check_data(data, loss, vocab_size=self._vocab_size, max_length=self._max_length)

    def _microbatches(self, checked: list[CheckedDatum]) -> list[list[int]]:
        return plan_microbatches([d.tokens for d in checked], self._budget)

    @property
    def max_batch_tokens(self) -> int:
        """The most padded tokens one micro-batch holds (:mod:`tempering.local.microbatch`)."""
        return self._budget.tokens

    @property
    def activation_checkpointing(self) -> bool:
        """Whether the decoder layers are recomputed in the backward pass."""
        return self._forward.activation_checkpointing

    def _builtin(
        self,
        data: list[tinker.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None,
        *,
        backward: bool,
    ) -> ttypes.ForwardBackwardOutput:
        loss = get_loss(loss_fn)
        config = resolve_config(loss, loss_fn_config)
        checked = self._check(data, loss_fn)
        parts = self._microbatches(checked)
        outputs: list[ttypes.LossFnOutput] = [{} for _ in checked]
        total = 0.0
        with torch.set_grad_enabled(backward), gradients_all_or_nothing(self._params):
            for rows in parts:
                batch = pad_batch([checked[i] for i in rows], loss, config, device=self._placement.device)
                lp = self._forward.target_logprobs(batch, batch.gradient if backward else None)
                micro = (loss.objective(lp, batch.inputs, config) * batch.mask).sum()
                if backward:
                    micro.backward()
                total += float(micro.detach())
                for i, out in zip(rows, self._outputs(per_datum_logprobs(lp, batch)), strict=True):
                    outputs[i] = out
        return ttypes.ForwardBackwardOutput(
            loss_fn_output_type=_OUTPUT_TYPE,
            loss_fn_outputs=outputs,
            metrics={"loss:sum": total},
        )

    def _custom(self, data: list[tinker.Datum], loss_fn: CustomLossFn) -> ttypes.ForwardBackwardOutput:
        """One forward pass with its graph kept when the request is one micro-batch; else a
        forward without gradients for the loss, then each micro-batch again with its share of
        the loss's gradient (two forward passes, as on the hosted service)."""
        checked = self._check(data, None)
        parts = self._microbatches(checked)
        device = self._placement.device
        per_datum: list[torch.Tensor] = [torch.empty(0) for _ in checked]
        with torch.set_grad_enabled(len(parts) == 1):
            for rows in parts:
                batch = pad_batch([checked[i] for i in rows], None, {}, device=device)
                for i, lp in zip(
                    rows, per_datum_logprobs(self._forward.target_logprobs(batch), batch), strict=True
                ):
                    per_datum[i] = lp
        with torch.enable_grad(), gradients_all_or_nothing(self._params):
            leaves = [lp.detach().to("cpu", torch.float32).requires_grad_(True) for lp in per_datum]
            loss, metrics = loss_fn(data, leaves)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise TypeError("a custom loss must return (loss, metrics) with loss a scalar torch.Tensor")
            if not loss.requires_grad:
                raise ValueError("the custom loss does not depend on the logprobs it was given")
            # With allow_unused, a logprob tensor the loss ignores gets None.
            grads = cast(
                "Sequence[torch.Tensor | None]",
                torch.autograd.grad(loss.reshape(()), leaves, allow_unused=True),
            )
            out_metrics = {str(k): _scalar(v) for k, v in dict(metrics).items()}
            grads_D = [
                (g if g is not None else torch.zeros_like(leaf)).to(device, lp.dtype)
                for g, leaf, lp in zip(grads, leaves, per_datum, strict=True)
            ]
            if len(parts) == 1:
                torch.autograd.backward(per_datum, grads_D)
            else:
                for rows in parts:
                    batch = pad_batch([checked[i] for i in rows], None, {}, device=device)
                    again = per_datum_logprobs(self._forward.target_logprobs(batch), batch)
                    torch.autograd.backward(again, [grads_D[i] for i in rows])
        out_metrics["loss:sum"] = float(loss.detach().reshape(()))
        return ttypes.ForwardBackwardOutput(
            loss_fn_output_type=_OUTPUT_TYPE,
            loss_fn_outputs=self._outputs(per_datum),
            metrics=out_metrics,
        )

    # ---- optimizer -----------------------------------------------------------------------------

    def optim_step(self, adam_params: tinker.AdamParams) -> LocalFuture[ttypes.OptimStepResponse]:
        """One AdamW step (as ``torch.optim.AdamW``, decoupled weight decay) with these settings,
        after clipping the global gradient norm to ``grad_clip_norm`` (0: no clipping); then
        clears the gradients. Metrics: ``grad_norm`` (before clipping)."""
        return self._worker.submit(lambda: self._optim_step(adam_params))

    def _optim_step(self, params: tinker.AdamParams) -> ttypes.OptimStepResponse:
        if not isinstance(params, tinker.AdamParams):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"optim_step takes tinker.AdamParams, got {type(params).__name__}")
        _check_adam_params(params)
        optimizer = self._ensure_optimizer()
        for group in optimizer.param_groups:
            group["lr"] = params.learning_rate
            group["betas"] = (params.beta1, params.beta2)
            group["eps"] = params.eps
            group["weight_decay"] = params.weight_decay
        grads = [p.grad for p in self._params.values() if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        if params.grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grads_with_norm_(
                [p for p in self._params.values() if p.grad is not None],
                params.grad_clip_norm,
                torch.tensor(norm),
            )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._steps += 1
        return ttypes.OptimStepResponse(metrics={"grad_norm": norm})

    def _ensure_optimizer(self) -> torch.optim.AdamW:
        if self._optimizer is None:
            self._optimizer = torch.optim.AdamW(list(self._params.values()), lr=0.0)
        return self._optimizer

    def _optimizer_state(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if self._optimizer is None:
            return out
        for name, p in self._params.items():
            state = self._optimizer.state.get(p)
            if state:
                out[f"exp_avg/{name}"] = state["exp_avg"]
                out[f"exp_avg_sq/{name}"] = state["exp_avg_sq"]
                out[f"step/{name}"] = torch.as_tensor(state["step"], dtype=torch.float32).reshape(1)
        return out

    # ---- checkpoints ---------------------------------------------------------------------------

    def _meta(self, kind: CheckpointKind, has_optimizer: bool) -> CheckpointMeta:
        return CheckpointMeta(
            kind=kind,
            base_model=self._spec.base_model,
            lora=self._spec.lora,
            has_optimizer=has_optimizer,
            optimizer_steps=self._steps,
        )

    def _weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach() for name, p in self._params.items()}

    def save_state(self, name: str, *, overwrite: bool = True) -> LocalFuture[ttypes.SaveWeightsResponse]:
        """Save weights and optimizer state; the path resumes training in any later process.

        A checkpoint of the same name is replaced, or with ``overwrite=False`` kept, and the
        future fails with :class:`~tempering.local.errors.CheckpointExistsError`."""

        def run() -> ttypes.SaveWeightsResponse:
            path = self._store.save(
                self._run_id,
                name,
                self._meta("weights", True),
                self._weights(),
                self._optimizer_state(),
                overwrite=overwrite,
            )
            return ttypes.SaveWeightsResponse(path=path, type="save_weights")

        return self._worker.submit(run)

    def save_weights_for_sampler(self, name: str) -> LocalFuture[ttypes.SaveWeightsForSamplerResponse]:
        """Save the weights for ``ServiceClient.create_sampling_client(model_path=...)``."""

        def run() -> ttypes.SaveWeightsForSamplerResponse:
            path = self._store.save(self._run_id, name, self._meta("sampler_weights", False), self._weights())
            return ttypes.SaveWeightsForSamplerResponse(path=path, type="save_weights_for_sampler")

        return self._worker.submit(run)

    def load_state(self, path: str) -> LocalFuture[ttypes.LoadWeightsResponse]:
        """Load the weights saved by ``save_state`` at ``path``; the optimizer starts afresh
        (as on the hosted service). See :meth:`load_state_with_optimizer`."""
        return self._worker.submit(lambda: self._load(path, with_optimizer=False))

    def load_state_with_optimizer(self, path: str) -> LocalFuture[ttypes.LoadWeightsResponse]:
        """Load the weights and the optimizer state saved by ``save_state`` at ``path``."""
        return self._worker.submit(lambda: self._load(path, with_optimizer=True))

    def _load(self, path: str, *, with_optimizer: bool) -> ttypes.LoadWeightsResponse:
        checkpoint = self._store.load(path, with_optimizer=with_optimizer)
        if checkpoint.meta.kind != "weights":
            raise IncompatibleCheckpointError(
                f"{path!r} was saved by save_weights_for_sampler; load_state needs a path from save_state"
            )
        self.restore(checkpoint, with_optimizer=with_optimizer)
        return ttypes.LoadWeightsResponse(path=path, model_id=self._run_id, type="load_weights")

    def restore(self, checkpoint: LoadedCheckpoint, *, with_optimizer: bool) -> None:
        """Copy a checkpoint's weights (and optimizer state) in; checks everything first.

        Runs on the caller's thread: use it only on a client that nothing else is using yet.
        """
        meta = checkpoint.meta
        if meta.base_model != self._spec.base_model:
            raise IncompatibleCheckpointError(
                f"{checkpoint.path!r} was trained from {meta.base_model!r}, "
                f"this client from {self._spec.base_model!r}"
            )
        if meta.lora != self._spec.lora:
            raise IncompatibleCheckpointError(
                f"{checkpoint.path!r} has LoRA {meta.lora}, this client has {self._spec.lora}"
            )
        if set(checkpoint.weights) != set(self._params):
            missing = sorted(set(self._params) - set(checkpoint.weights))[:3]
            extra = sorted(set(checkpoint.weights) - set(self._params))[:3]
            raise IncompatibleCheckpointError(
                f"{checkpoint.path!r} does not match this model's parameters "
                f"(missing {missing}, extra {extra})"
            )
        for name, p in self._params.items():
            if tuple(checkpoint.weights[name].shape) != tuple(p.shape):
                raise IncompatibleCheckpointError(
                    f"{checkpoint.path!r}: {name} has shape {tuple(checkpoint.weights[name].shape)}, "
                    f"the model has {tuple(p.shape)}"
                )
        optimizer_state = checkpoint.optimizer if with_optimizer else None
        with torch.no_grad():
            for name, p in self._params.items():
                p.copy_(checkpoint.weights[name].to(p.device, p.dtype))
                p.grad = None
        self._optimizer = None
        self._steps = meta.optimizer_steps if with_optimizer else 0
        if optimizer_state:
            optimizer = self._ensure_optimizer()
            for name, p in self._params.items():
                if f"step/{name}" not in optimizer_state:
                    continue
                optimizer.state[p] = {
                    "step": optimizer_state[f"step/{name}"].reshape(()).to(torch.float32),
                    "exp_avg": optimizer_state[f"exp_avg/{name}"].to(p.device, p.dtype),
                    "exp_avg_sq": optimizer_state[f"exp_avg_sq/{name}"].to(p.device, p.dtype),
                }

    # ---- sampling ------------------------------------------------------------------------------

    def snapshot(self) -> SamplerModel:
        """Frozen weights for sampling as they are now (call it on the client's own thread, or
        between requests). A LoRA snapshot shares the base weights and copies only the adapter
        (:func:`~tempering.local.model.sampling_copy`)."""
        return SamplerModel.create(
            sampling_copy(self._model),
            base_model=self._spec.base_model,
            model_dir=self._spec.model_dir,
            placement=self._placement,
            tokenizer=self._tokenizer,
        )

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> LocalSamplingClient:
        """A sampling client for the weights as they are once the requests queued before this
        call have run. Returns at once; its requests wait for the snapshot. ``name`` is
        ignored (as on the hosted service, these weights are not kept on disk)."""
        del name
        return LocalSamplingClient(self._worker.submit(self.snapshot).future())

    def create_sampling_client(self, model_path: str) -> LocalSamplingClient:
        """A sampling client for the weights saved at ``model_path`` by this or another client."""
        load = self._load_sampler
        return LocalSamplingClient(self._worker.submit(lambda: load(model_path)).future())

    # ---- information ---------------------------------------------------------------------------

    def get_info(self) -> ttypes.GetInfoResponse:
        """The base model, LoRA rank and run id."""
        lora = self._spec.lora
        return ttypes.GetInfoResponse(
            type="get_info",
            model_data=ttypes.ModelData(
                arch=self._arch, model_name=self._spec.base_model, tokenizer_id=self._spec.base_model
            ),
            model_id=self._run_id,
            is_lora=lora is not None,
            lora_rank=lora.rank if lora is not None else None,
            model_name=self._spec.base_model,
        )

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's Hugging Face tokenizer."""
        return self._tokenizer

    @property
    def spec(self) -> ModelSpec:
        """The base model and LoRA shape this client trains."""
        return self._spec

    @property
    def model_id(self) -> str:
        """This training run's id (the ``<run_id>`` in its checkpoint paths)."""
        return self._run_id

    @property
    def device(self) -> torch.device:
        return self._placement.device


def _scalar(value: object) -> float:
    """A metric value as a float (a tensor is detached first)."""
    if isinstance(value, torch.Tensor):
        return float(value.detach().reshape(()))
    if isinstance(value, int | float | np.floating | np.integer):
        return float(value)
    raise TypeError(f"metric values must be numbers, got {type(value).__name__}")


def _check_adam_params(params: tinker.AdamParams) -> None:
    """Refuse settings that would turn the weights into NaN, naming the field.

    Written as ``not (ok)`` so that NaN, for which every comparison is false, is refused too.
    """
    for name in ("learning_rate", "eps", "weight_decay", "grad_clip_norm"):
        value = float(getattr(params, name))
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"invalid AdamParams: {name} must be a finite number >= 0, got {value}")
    for name in ("beta1", "beta2"):
        value = float(getattr(params, name))
        if not 0 <= value < 1:
            raise ValueError(f"invalid AdamParams: {name} must be in [0, 1), got {value}")
