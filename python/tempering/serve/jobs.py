"""What runs on a training model's ordered queue for each training request of the SDK
(:meth:`tempering.serve.engine.Engine.submit_ordered` runs them in ``seq_id`` order), and what
each answers. The checks that can refuse a request (4xx) run when the job is made, before it is
queued; the job itself runs on the model's thread.

A named checkpoint saved with ``ttl_seconds`` or ``user_metadata`` keeps them in its
``tinker.json`` (:meth:`tempering.local.checkpoints.CheckpointStore.annotate`): the listings show
them as the SDK's ``Checkpoint.expires_at`` and ``Checkpoint.user_metadata``, and an expired
checkpoint is removed at the next listing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import tinker
from tinker import types as ttypes

from tempering.local.checkpoints import CheckpointStore
from tempering.local.training import LocalTrainingClient
from tempering.serve.state import (
    Payload,
    check_optimizer,
    check_ttl,
    metadata_strings,
    to_tinker_path,
)
from tempering.serve.wire import ForwardBackwardCall, encode_forward_backward_output, proto_datums

__all__ = [
    "Job",
    "forward_backward_job",
    "info_payload",
    "load_state_job",
    "optim_step_job",
    "save_sampler_weights_job",
    "save_state_job",
]

Job = Callable[[LocalTrainingClient], Payload]
"""A training request's work: runs on the model's queue, returns what goes on the wire."""


def forward_backward_job(call: ForwardBackwardCall) -> Job:
    loss_fn, config, forward_only, message = (
        call.loss_fn,
        call.loss_fn_config,
        call.forward_only,
        call.message,
    )

    def job(trainer: LocalTrainingClient) -> Payload:
        data = proto_datums(message)  # decoding (and densifying sparse inputs) runs here, off the loop
        run = trainer.forward if forward_only else trainer.forward_backward
        output = run(data, loss_fn, config).result()  # pyright: ignore[reportArgumentType]
        return ("proto", encode_forward_backward_output(output))

    return job


def optim_step_job(request: ttypes.OptimStepRequest) -> Job:
    params = request.optim_params
    check_optimizer("optim_step", params)
    assert isinstance(params, tinker.AdamParams)

    def job(trainer: LocalTrainingClient) -> Payload:
        response = trainer.optim_step(params).result()
        return ("json", {"metrics": dict(response.metrics or {}), "type": "optim_step"})

    return job


def _annotate(
    store: CheckpointStore, path: str, expires_at: float | None, metadata: dict[str, str] | None
) -> None:
    if expires_at is not None or metadata is not None:
        store.annotate(path, expires_at=expires_at, user_metadata=metadata)


def save_state_job(store: CheckpointStore, request: ttypes.SaveWeightsRequest) -> Job:
    name, overwrite = request.path, request.overwrite
    expires_at = check_ttl("save_weights", request.ttl_seconds)
    metadata = metadata_strings(request.user_metadata)

    def job(trainer: LocalTrainingClient) -> Payload:
        # The existence check runs here, in order on the model's queue, so that two saves of
        # one name queued back to back are caught too; the refusal writes nothing.
        checkpoint = name or f"state-{uuid.uuid4().hex[:12]}"
        response = trainer.save_state(checkpoint, overwrite=overwrite).result()
        _annotate(store, response.path, expires_at, metadata)
        return ("json", {"path": to_tinker_path(response.path), "type": "save_weights"})

    return job


def save_sampler_weights_job(store: CheckpointStore, request: ttypes.SaveWeightsForSamplerRequest) -> Job:
    """``save_weights_for_sampler`` with a ``path``: a named sampler checkpoint."""
    assert request.path is not None
    name = request.path
    expires_at = check_ttl("save_weights_for_sampler", request.ttl_seconds)
    metadata = metadata_strings(request.user_metadata)

    def job(trainer: LocalTrainingClient) -> Payload:
        response = trainer.save_weights_for_sampler(name).result()
        _annotate(store, response.path, expires_at, metadata)
        return ("json", {"path": to_tinker_path(response.path), "type": "save_weights_for_sampler"})

    return job


def load_state_job(request: ttypes.LoadWeightsRequest, path: str) -> Job:
    """Legacy ``load_weights`` on an existing model (``path``: the checkpoint's local path)."""
    with_optimizer, tinker_path, model_id = request.optimizer, request.path, request.model_id

    def job(trainer: LocalTrainingClient) -> Payload:
        if with_optimizer:
            trainer.load_state_with_optimizer(path).result()
        else:
            trainer.load_state(path).result()
        return ("json", {"path": tinker_path, "model_id": model_id, "type": "load_weights"})

    return job


def info_payload(trainer: LocalTrainingClient, model_id: str) -> dict[str, object]:
    """``get_info``'s answer (the model directory stands for the model's name and tokenizer)."""
    info = trainer.get_info()
    model_dir = str(trainer.spec.model_dir)
    return {
        "type": "get_info",
        "model_data": {"arch": info.model_data.arch, "model_name": model_dir, "tokenizer_id": model_dir},
        "model_id": model_id,
        "is_lora": info.is_lora,
        "lora_rank": info.lora_rank,
        "model_name": model_dir,
    }
