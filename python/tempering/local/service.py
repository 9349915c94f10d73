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

from tempering.local.checkpoints import CheckpointStore
from tempering.local.futures import LocalFuture, Worker, WorkerClient, set_torch_threads
from tempering.local.loader import LoraShape, ModelLoader
from tempering.local.model import Placement, resolve_placement
from tempering.local.sampling import LocalSamplingClient
from tempering.local.training import LocalTrainingClient

__all__ = ["ServiceClient"]


class ServiceClient(WorkerClient):
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
        self._store.clean_scratch()  # orphans of saves killed midway
        self._placement = resolve_placement(device, dtype)
        self._loader = ModelLoader(self._store, self._placement)
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
        lora = LoraShape(rank, train_mlp, train_attn, train_unembed)
        return self._worker.submit(lambda: self._loader.trainer(base_model, lora, seed or 0))

    def create_full_training_client(self, base_model: str) -> LocalFuture[LocalTrainingClient]:
        """A client that trains every parameter of ``base_model`` (local engine only)."""
        return self._worker.submit(lambda: self._loader.trainer(base_model, None))

    def create_training_client_from_state(
        self, path: str, user_metadata: dict[str, str] | None = None
    ) -> LocalFuture[LocalTrainingClient]:
        """A new training run starting from the weights saved by ``save_state`` at ``path``;
        the optimizer starts afresh (see the ``_with_optimizer`` variant)."""
        del user_metadata
        return self._worker.submit(lambda: self._loader.trainer_from_checkpoint(path, with_optimizer=False))

    def create_training_client_from_state_with_optimizer(
        self, path: str, user_metadata: dict[str, str] | None = None
    ) -> LocalFuture[LocalTrainingClient]:
        """Like :meth:`create_training_client_from_state`, also restoring the optimizer state."""
        del user_metadata
        return self._worker.submit(lambda: self._loader.trainer_from_checkpoint(path, with_optimizer=True))

    def create_sampling_client(
        self, model_path: str | None = None, base_model: str | None = None
    ) -> LocalFuture[LocalSamplingClient]:
        """A sampling client for saved weights (``model_path``) or a base model."""
        if (model_path is None) == (base_model is None):
            return LocalFuture.failed(ValueError("give exactly one of model_path or base_model"))
        loader = self._loader
        if model_path is not None:
            return self._worker.submit(lambda: LocalSamplingClient(loader.sampler(model_path)))
        assert base_model is not None
        return self._worker.submit(lambda: LocalSamplingClient(loader.base_sampler(base_model)))
