"""``tempering.local.ServiceClient``: the local engine's entry point, with the factory methods
of ``tinker.ServiceClient``.

Each factory returns a future of the client at once (``.result()`` or ``await`` it); loading
runs on the service client's own thread. Errors (a model directory that doesn't load, an
unknown checkpoint path) are raised through that future.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tempering.local.checkpoints import CheckpointStore, LoraMeta
from tempering.local.errors import IncompatibleCheckpointError
from tempering.local.futures import LocalFuture, Worker, set_torch_threads
from tempering.local.model import (
    LORA_ALPHA,
    Placement,
    apply_lora,
    inference_copy,
    load_base_model,
    load_tokenizer,
    lora_targets,
    move,
    resolve_model_dir,
    resolve_placement,
)
from tempering.local.sampling import LocalSamplingClient, SamplerModel
from tempering.local.tiny import TINY_MODEL
from tempering.local.training import LocalTrainingClient, ModelSpec

__all__ = ["ServiceClient", "load_sampler"]


def _build_trainer(
    base_model: str,
    lora: tuple[int, bool, bool, bool] | LoraMeta | None,
    seed: int,
    store: CheckpointStore,
    placement: Placement,
) -> LocalTrainingClient:
    """Load ``base_model`` and wrap it for training (LoRA given as ``(rank, mlp, attn, unembed)``
    or as a saved shape; None for full fine-tuning)."""
    model_dir = resolve_model_dir(base_model, store.root)
    name = base_model if base_model == TINY_MODEL else str(model_dir)
    model = load_base_model(model_dir, placement, on_cpu=lora is not None)
    tokenizer = load_tokenizer(model_dir)
    if lora is None:
        spec = ModelSpec(name, model_dir, None)
        trained: torch.nn.Module = model
        trained.requires_grad_(True)
    else:
        if isinstance(lora, tuple):
            rank, mlp, attn, unembed = lora
            if rank < 1:
                raise ValueError(f"LoRA rank must be >= 1, got {rank}")
            targets = lora_targets(model, train_mlp=mlp, train_attn=attn, train_unembed=unembed)
            lora = LoraMeta(rank=rank, alpha=LORA_ALPHA, target_modules=targets)
        spec = ModelSpec(name, model_dir, lora)
        trained = apply_lora(model, lora, seed)
        move(trained, placement.device)
    return LocalTrainingClient(trained, spec, placement, tokenizer, store)


def load_sampler(model_path: str, store: CheckpointStore, placement: Placement) -> SamplerModel:
    """A frozen, merged model for sampling from the weights saved at ``model_path``."""
    checkpoint = store.load(model_path)
    meta = checkpoint.meta
    trainer = _build_trainer(meta.base_model, meta.lora, 0, store, placement)
    try:
        trainer.restore(checkpoint, with_optimizer=False)
        return trainer._snapshot()  # pyright: ignore[reportPrivateUsage]
    finally:
        trainer.close()


def _load_base_sampler(base_model: str, store: CheckpointStore, placement: Placement) -> SamplerModel:
    model_dir = resolve_model_dir(base_model, store.root)
    model = inference_copy(load_base_model(model_dir, placement))
    name = base_model if base_model == TINY_MODEL else str(model_dir)
    return SamplerModel.create(
        model, base_model=name, model_dir=model_dir, placement=placement, tokenizer=load_tokenizer(model_dir)
    )


class ServiceClient:
    """Creates local training and sampling clients, like ``tinker.ServiceClient``.

    ``root``: the checkpoint store (default ``$TEMPERING_HOME`` or ``~/.cache/tempering``).
    ``device`` / ``dtype``: default ``$TEMPERING_DEVICE`` / ``$TEMPERING_DTYPE``, else CUDA with
    bfloat16 when available, else CPU with float32.
    ``num_threads``: torch's intra-op threads (default ``$TEMPERING_NUM_THREADS``, else torch's
    own default); process-wide. ``1`` is often fastest for small models on a busy CPU.

    Example::

        service = tempering.local.ServiceClient()
        trainer = service.create_lora_training_client("tempering/tiny", rank=8).result()
        sampler = service.create_sampling_client(base_model="tempering/tiny").result()
    """

    def __init__(
        self,
        *,
        root: str | os.PathLike[str] | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        num_threads: int | None = None,
    ) -> None:
        threads = num_threads if num_threads is not None else os.environ.get("TEMPERING_NUM_THREADS")
        if threads is not None and threads != "":
            set_torch_threads(int(threads))
        self._store = CheckpointStore(root)
        self._placement = resolve_placement(device, dtype)
        self._worker = Worker("service")

    @property
    def root(self) -> Path:
        """The checkpoint store's directory."""
        return self._store.root

    @property
    def placement(self) -> Placement:
        """The device and dtype models are loaded with."""
        return self._placement

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
    ) -> LocalFuture[LocalTrainingClient]:
        """A client that trains a LoRA adapter of ``rank`` on ``base_model`` (``"tempering/tiny"``
        or a local model directory). ``seed`` initialises the adapter (None: 0, so runs repeat);
        ``user_metadata`` is accepted and ignored."""
        del user_metadata
        store, placement = self._store, self._placement
        lora = (rank, train_mlp, train_attn, train_unembed)
        return self._worker.submit(lambda: _build_trainer(base_model, lora, seed or 0, store, placement))

    def create_full_training_client(self, base_model: str) -> LocalFuture[LocalTrainingClient]:
        """A client that trains every parameter of ``base_model`` (local engine only)."""
        store, placement = self._store, self._placement
        return self._worker.submit(lambda: _build_trainer(base_model, None, 0, store, placement))

    def create_training_client_from_state(
        self, path: str, user_metadata: dict[str, str] | None = None
    ) -> LocalFuture[LocalTrainingClient]:
        """A new training run starting from the weights saved by ``save_state`` at ``path``;
        the optimizer starts afresh (see the ``_with_optimizer`` variant)."""
        del user_metadata
        return self._worker.submit(lambda: self._from_state(path, with_optimizer=False))

    def create_training_client_from_state_with_optimizer(
        self, path: str, user_metadata: dict[str, str] | None = None
    ) -> LocalFuture[LocalTrainingClient]:
        """Like :meth:`create_training_client_from_state`, also restoring the optimizer state."""
        del user_metadata
        return self._worker.submit(lambda: self._from_state(path, with_optimizer=True))

    def _from_state(self, path: str, *, with_optimizer: bool) -> LocalTrainingClient:
        checkpoint = self._store.load(path, with_optimizer=with_optimizer)
        meta = checkpoint.meta
        if meta.kind != "weights":
            raise IncompatibleCheckpointError(
                f"{path!r} was saved by save_weights_for_sampler; training resumes from a save_state path"
            )
        client = _build_trainer(meta.base_model, meta.lora, 0, self._store, self._placement)
        client.restore(checkpoint, with_optimizer=with_optimizer)
        return client

    def create_sampling_client(
        self, model_path: str | None = None, base_model: str | None = None
    ) -> LocalFuture[LocalSamplingClient]:
        """A sampling client for saved weights (``model_path``) or a base model."""
        if (model_path is None) == (base_model is None):
            return LocalFuture.failed(ValueError("give exactly one of model_path or base_model"))
        store, placement = self._store, self._placement
        if model_path is not None:
            return self._worker.submit(
                lambda: LocalSamplingClient(load_sampler(model_path, store, placement))
            )
        assert base_model is not None
        return self._worker.submit(
            lambda: LocalSamplingClient(_load_base_sampler(base_model, store, placement))
        )

    def close(self) -> None:
        self._worker.close(wait=True)

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
