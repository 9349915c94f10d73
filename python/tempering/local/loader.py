"""The local engine's loader: training clients and sampler models, from a base model or from a
checkpoint. ``tempering.local.ServiceClient`` and the server (``tempering.serve``) both build
their models here.

With ``share_bases`` (the server), each base model is loaded once and kept: a LoRA training
client wraps a shallow structural copy of it whose frozen base parameters are the same tensors,
and a sampler of the base model samples from it directly (nothing ever writes to the base
weights). Without it (the in-process service client), every client loads its own copy, so a
closed client frees its memory.

Example::

    loader = ModelLoader(CheckpointStore(), resolve_placement(None, None))
    trainer = loader.trainer("tempering/tiny", LoraShape(rank=8))
    sampler = LocalSamplingClient(loader.sampler(saved_path))
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tempering.local.checkpoints import CheckpointMeta, CheckpointStore, LoadedCheckpoint, LoraMeta
from tempering.local.errors import IncompatibleCheckpointError
from tempering.local.model import (
    LORA_ALPHA,
    Placement,
    apply_lora,
    frozen_shared_copy,
    load_base_model,
    load_tokenizer,
    lora_targets,
    move,
    resolve_model_dir,
    sampling_copy,
)
from tempering.local.sampling import SamplerModel
from tempering.local.tiny import TINY_MODEL
from tempering.local.training import LocalTrainingClient, ModelSpec, TrainingMemory
from tempering.model_info import packaged_model

__all__ = ["LoadedBase", "LoraShape", "ModelLoader"]


@dataclass(frozen=True)
class LoraShape:
    """A new LoRA adapter, as ``create_lora_training_client`` asks for one."""

    rank: int
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


@dataclass(frozen=True)
class LoadedBase:
    """A base model loaded once and shared (frozen) by the clients built on it."""

    name: str
    model_dir: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


class ModelLoader:
    """Builds training clients and sampler models for one checkpoint store and placement.

    ``share_bases``: keep each base model loaded and share its frozen weights between clients
    (see the module docstring). ``memory``: the training clients' micro-batch budget and
    activation checkpointing (default: from the environment, see :class:`TrainingMemory`).
    Thread-safe: the server loads from several worker threads.
    """

    def __init__(
        self,
        store: CheckpointStore,
        placement: Placement,
        *,
        share_bases: bool = False,
        memory: TrainingMemory | None = None,
    ) -> None:
        self.store = store
        self.memory = memory
        self.placement = placement
        self._share_bases = share_bases
        self._bases: dict[Path, LoadedBase] = {}
        self._lock = threading.Lock()

    def model_dir(self, base_model: str) -> Path:
        """The directory of ``base_model`` (``tempering/tiny`` or a local model directory)."""
        return resolve_model_dir(base_model, self.store.root)

    def _name(self, base_model: str, model_dir: Path) -> str:
        """The name checkpoints record: the tiny model's and a packaged model's own name (its
        hub name), so that they survive a moved cache; else the resolved directory."""
        if base_model == TINY_MODEL:
            return base_model
        packaged = packaged_model(base_model)
        if packaged is not None:
            return packaged.hub_name
        return str(model_dir)

    def base(self, base_model: str) -> LoadedBase:
        """``base_model`` loaded once (on the calling thread) and kept, frozen."""
        model_dir = self.model_dir(base_model)
        with self._lock:
            base = self._bases.get(model_dir)
            if base is None:
                model = load_base_model(model_dir, self.placement)
                model.requires_grad_(False)
                base = LoadedBase(
                    self._name(base_model, model_dir), model_dir, model, load_tokenizer(model_dir)
                )
                self._bases[model_dir] = base
            return base

    def trainer(
        self, base_model: str, lora: LoraShape | LoraMeta | None, seed: int = 0
    ) -> LocalTrainingClient:
        """A training client for ``base_model``: a new adapter (:class:`LoraShape`), a saved
        adapter's shape (:class:`LoraMeta`), or None for full fine-tuning (never shared)."""
        if isinstance(lora, LoraShape) and lora.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {lora.rank}")
        if lora is not None and self._share_bases:
            base = self.base(base_model)
            meta = _lora_meta(base.model, lora)
            # Copy the module tree, not the frozen base parameters (no client writes to them).
            trained: torch.nn.Module = apply_lora(frozen_shared_copy(base.model), meta, seed)
            move(trained, self.placement.device)
            spec = ModelSpec(base.name, base.model_dir, meta)
            return self._client(trained, spec, base.tokenizer)
        model_dir = self.model_dir(base_model)
        name = self._name(base_model, model_dir)
        model = load_base_model(model_dir, self.placement, on_cpu=lora is not None)
        tokenizer = load_tokenizer(model_dir)
        if lora is None:
            trained = model
            trained.requires_grad_(True)
            return self._client(trained, ModelSpec(name, model_dir, None), tokenizer)
        meta = _lora_meta(model, lora)
        trained = apply_lora(model, meta, seed)
        move(trained, self.placement.device)
        return self._client(trained, ModelSpec(name, model_dir, meta), tokenizer)

    def _client(
        self, model: torch.nn.Module, spec: ModelSpec, tokenizer: PreTrainedTokenizerBase
    ) -> LocalTrainingClient:
        return LocalTrainingClient(
            model, spec, self.placement, tokenizer, self.store, load_sampler=self.sampler, memory=self.memory
        )

    def trainer_from_checkpoint(
        self, path: str, *, with_optimizer: bool, shown_as: str | None = None
    ) -> LocalTrainingClient:
        """A training client restored from the ``save_state`` checkpoint at ``path`` (with its
        optimizer state or not). ``shown_as``: how errors name the path (default ``path``)."""
        checkpoint = self.store.load(path, with_optimizer=with_optimizer)
        meta = checkpoint.meta
        if meta.kind != "weights":
            raise IncompatibleCheckpointError(
                f"{shown_as or path!r} was saved by save_weights_for_sampler; "
                "training resumes from a save_state path"
            )
        client = self.trainer(meta.base_model, meta.lora, 0)
        client.restore(checkpoint, with_optimizer=with_optimizer)
        return client

    def sampler(self, model_path: str) -> SamplerModel:
        """Frozen weights for sampling from the checkpoint at ``model_path`` (a LoRA adapter
        over the base model, which is shared when the loader shares bases)."""
        checkpoint = self.store.load(model_path)
        meta = checkpoint.meta
        trainer = self.trainer(meta.base_model, meta.lora, 0)
        try:
            trainer.restore(checkpoint, with_optimizer=False)
            return trainer.snapshot()
        finally:
            trainer.close()

    def sampler_from_weights(
        self,
        base_model: str,
        lora: LoraMeta,
        weights: Mapping[str, torch.Tensor],
        *,
        shown_as: str = "weights",
    ) -> SamplerModel:
        """Frozen weights for sampling from adapter ``weights`` (by parameter name, as a LoRA
        training client of ``base_model`` with shape ``lora`` names them)."""
        meta = CheckpointMeta(
            kind="sampler_weights", base_model=base_model, lora=lora, has_optimizer=False, optimizer_steps=0
        )
        trainer = self.trainer(base_model, lora, 0)
        try:
            trainer.restore(LoadedCheckpoint(shown_as, meta, dict(weights), None), with_optimizer=False)
            return trainer.snapshot()
        finally:
            trainer.close()

    def base_sampler(self, base_model: str) -> SamplerModel:
        """A model for sampling from ``base_model`` itself (the shared base with ``share_bases``)."""
        if self._share_bases:
            base = self.base(base_model)
            model: torch.nn.Module = base.model
            name, model_dir, tokenizer = base.name, base.model_dir, base.tokenizer
        else:
            model_dir = self.model_dir(base_model)
            model = sampling_copy(load_base_model(model_dir, self.placement))
            name, tokenizer = self._name(base_model, model_dir), load_tokenizer(model_dir)
        return SamplerModel.create(
            model, base_model=name, model_dir=model_dir, placement=self.placement, tokenizer=tokenizer
        )


def _lora_meta(model: PreTrainedModel, lora: LoraShape | LoraMeta) -> LoraMeta:
    """The adapter to add: a saved shape as it is, a new one targeting the chosen modules."""
    if isinstance(lora, LoraMeta):
        return lora
    targets = lora_targets(
        model, train_mlp=lora.train_mlp, train_attn=lora.train_attn, train_unembed=lora.train_unembed
    )
    return LoraMeta(rank=lora.rank, alpha=LORA_ALPHA, target_modules=targets)
