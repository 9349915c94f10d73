"""Where the local engine keeps checkpoints, and the paths it hands out for them.

Layout under the store's root (``$TEMPERING_HOME``, else ``~/.cache/tempering``)::

    checkpoints/<run_id>/weights/<name>/          save_state: weights + optimizer state
    checkpoints/<run_id>/sampler_weights/<name>/  save_weights_for_sampler: weights only
    models/tempering-tiny-v1-seed0/               the built-in tiny model

Each checkpoint directory holds ``meta.json`` (base model, LoRA shape, kind),
``weights.safetensors`` (the trainable tensors, by parameter name) and, for ``save_state``,
``optimizer.safetensors`` (Adam moments and step counts, by parameter name). What is said about
a checkpoint after it is written (its expiry time ``expires_at``, the ``user_metadata`` it was
saved with, where a copy came from) goes in a ``tinker.json`` beside them
(:meth:`CheckpointStore.annotations`, :meth:`CheckpointStore.annotate`).

Paths handed out look like the hosted service's, with their own scheme:
``tempering://<run_id>/weights/<name>``. They resolve against the store's root, so they survive
a process restart (and a move of the whole root). A plain filesystem path to a checkpoint
directory is accepted wherever such a path is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias, cast

import torch
from safetensors.torch import load_file, save_file

from tempering.fs import naming
from tempering.local.errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    IncompatibleCheckpointError,
)

__all__ = [
    "SCHEME",
    "SIDECAR",
    "CheckpointKind",
    "CheckpointMeta",
    "CheckpointStore",
    "LoraMeta",
    "default_root",
    "read_sidecar",
    "staged_dir",
    "write_sidecar",
]

SCHEME = "tempering://"
SIDECAR = "tinker.json"
"""A checkpoint's annotations: JSON beside its files (``expires_at``, ``user_metadata``, ...)."""
_FORMAT = "tempering-local-checkpoint"
_FORMAT_VERSION = 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")

CheckpointKind: TypeAlias = Literal["weights", "sampler_weights"]


@contextlib.contextmanager
def staged_dir(target: Path, *, prefix: str) -> Generator[Path]:
    """A scratch directory beside ``target`` to write into: when the block ends without error
    it takes ``target``'s place (a previous ``target`` is moved aside, then removed); on an
    error it is removed and ``target`` is left as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        yield scratch
        if target.exists():
            old = target.with_name(f".{target.name}-old-{uuid.uuid4().hex[:8]}")
            target.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        scratch.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def read_sidecar(directory: Path) -> dict[str, Any]:
    """The annotations kept in ``directory/tinker.json`` (empty if none or unreadable)."""
    try:
        raw = json.loads((directory / SIDECAR).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return dict(cast("dict[str, Any]", raw)) if isinstance(raw, dict) else {}


def write_sidecar(directory: Path, **fields: Any) -> None:
    """Merge ``fields`` into ``directory/tinker.json`` (atomically: written aside, then renamed)."""
    data = {**read_sidecar(directory), **fields}
    scratch = directory / f".{SIDECAR}.{uuid.uuid4().hex[:8]}"
    scratch.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    scratch.replace(directory / SIDECAR)


def default_root() -> Path:
    """``$TEMPERING_HOME`` if set, else ``~/.cache/tempering``."""
    env = os.environ.get("TEMPERING_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tempering"


@dataclass(frozen=True)
class LoraMeta:
    """The shape of a LoRA adapter: enough to rebuild the same parameters."""

    rank: int
    alpha: int
    target_modules: tuple[str, ...]


@dataclass(frozen=True)
class CheckpointMeta:
    """What ``meta.json`` records about a checkpoint."""

    kind: CheckpointKind
    base_model: str
    lora: LoraMeta | None
    has_optimizer: bool
    optimizer_steps: int

    def to_json(self) -> dict[str, object]:
        lora = None
        if self.lora is not None:
            lora = {
                "rank": self.lora.rank,
                "alpha": self.lora.alpha,
                "target_modules": list(self.lora.target_modules),
            }
        return {
            "format": _FORMAT,
            "version": _FORMAT_VERSION,
            "kind": self.kind,
            "base_model": self.base_model,
            "lora": lora,
            "has_optimizer": self.has_optimizer,
            "optimizer_steps": self.optimizer_steps,
        }

    @staticmethod
    def from_json(raw: Mapping[str, object], where: str) -> CheckpointMeta:
        if raw.get("format") != _FORMAT or raw.get("version") != _FORMAT_VERSION:
            raise IncompatibleCheckpointError(f"{where} is not a tempering local checkpoint")
        kind = raw.get("kind")
        if kind not in ("weights", "sampler_weights"):
            raise IncompatibleCheckpointError(f"{where}: unknown checkpoint kind {kind!r}")
        lora_raw = raw.get("lora")
        lora = None
        if isinstance(lora_raw, dict):
            fields = cast("dict[str, object]", lora_raw)
            modules = fields["target_modules"]
            assert isinstance(modules, list)
            lora = LoraMeta(
                rank=int(cast("int", fields["rank"])),
                alpha=int(cast("int", fields["alpha"])),
                target_modules=tuple(str(m) for m in cast("list[object]", modules)),
            )
        return CheckpointMeta(
            kind=kind,
            base_model=str(raw["base_model"]),
            lora=lora,
            has_optimizer=bool(raw.get("has_optimizer", False)),
            optimizer_steps=int(cast("int", raw.get("optimizer_steps", 0))),
        )


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint read back: its metadata, weights and (maybe) optimizer state."""

    path: str
    meta: CheckpointMeta
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, torch.Tensor] | None


_log = logging.getLogger(__name__)

SCRATCH_MAX_AGE_S = 300.0
"""A checkpoint scratch directory untouched for this long is an orphan of a killed save."""


class CheckpointStore:
    """A directory of checkpoints, addressed by ``tempering://`` paths.

    Example::

        store = CheckpointStore()                      # $TEMPERING_HOME or ~/.cache/tempering
        uri = store.save("run-1", "weights", "step-10", meta, weights, optimizer)
        ckpt = store.load(uri)
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_root()

    def clean_scratch(self, max_age_s: float = SCRATCH_MAX_AGE_S) -> list[Path]:
        """Remove the scratch directories (``<name>/.step-10-xxxx``) that a save killed midway
        left behind; return them. One touched within ``max_age_s`` may be a save in progress in
        another process, and is kept. Called when a service starts.

        Example::

            CheckpointStore().clean_scratch()   # [PosixPath('.../weights/.step-10-k2j3')]
        """
        removed: list[Path] = []
        now = time.time()
        for kind_dir in self.root.glob("checkpoints/*/*"):
            if kind_dir.name not in ("weights", "sampler_weights") or not kind_dir.is_dir():
                continue
            for scratch in kind_dir.glob(".*"):
                if not scratch.is_dir():
                    continue
                try:
                    newest = max([scratch.stat().st_mtime, *(f.stat().st_mtime for f in scratch.iterdir())])
                except OSError:
                    continue  # removed meanwhile
                if now - newest >= max_age_s:
                    shutil.rmtree(scratch, ignore_errors=True)
                    removed.append(scratch)
        if removed:
            _log.warning(
                "removed %d scratch director%s left by interrupted checkpoint saves: %s",
                len(removed),
                "y" if len(removed) == 1 else "ies",
                ", ".join(str(p) for p in removed[:5]),
            )
        return removed

    @staticmethod
    def new_run_id() -> str:
        return f"run-{uuid.uuid4().hex[:16]}"

    def _checkpoint_dir(self, run_id: str, kind: CheckpointKind, name: str) -> Path:
        return self.root / "checkpoints" / run_id / kind / name

    def save(
        self,
        run_id: str,
        name: str,
        meta: CheckpointMeta,
        weights: Mapping[str, torch.Tensor],
        optimizer: Mapping[str, torch.Tensor] | None = None,
        *,
        overwrite: bool = True,
    ) -> str:
        """Write a checkpoint atomically and return its path. One of the same name is replaced,
        or, with ``overwrite=False``, kept and :class:`CheckpointExistsError` raised."""
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"checkpoint name {name!r}: use 1-128 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        target = self._checkpoint_dir(run_id, meta.kind, name)
        if not overwrite and target.exists():
            raise CheckpointExistsError(
                f"checkpoint name {name!r} is taken ({SCHEME}{run_id}/{meta.kind}/{name}); "
                "choose another name, or pass overwrite=True to replace it"
            )
        with naming(target), staged_dir(target, prefix=f".{name}-") as scratch:
            save_file(_contiguous_cpu(weights), str(scratch / "weights.safetensors"))
            if optimizer is not None:
                save_file(_contiguous_cpu(optimizer), str(scratch / "optimizer.safetensors"))
            (scratch / "meta.json").write_text(json.dumps(meta.to_json(), indent=2) + "\n")
        return f"{SCHEME}{run_id}/{meta.kind}/{name}"

    def resolve(self, path: str) -> Path:
        """The directory of the checkpoint at ``path`` (a ``tempering://`` path or a directory)."""
        if path.startswith(SCHEME):
            parts = path[len(SCHEME) :].split("/")
            if (
                len(parts) != 3
                or parts[1] not in ("weights", "sampler_weights")
                or not all(parts)
                or any(part in (".", "..") or "\\" in part for part in parts)
            ):
                raise CheckpointNotFoundError(
                    f"{path!r} is not a checkpoint path: expected "
                    f"{SCHEME}<run_id>/weights/<name> or {SCHEME}<run_id>/sampler_weights/<name>"
                )
            directory = self.root / "checkpoints" / parts[0] / parts[1] / parts[2]
        elif "://" in path:
            raise CheckpointNotFoundError(
                f"{path!r}: the local engine reads {SCHEME} paths and directories only"
                " (a tinker:// path names a checkpoint on the hosted service)"
            )
        else:
            directory = Path(path).expanduser()
        if not (directory / "meta.json").is_file():
            raise CheckpointNotFoundError(f"no checkpoint at {path!r} (looked in {directory})")
        return directory

    def annotations(self, path: str) -> dict[str, Any]:
        """What :meth:`annotate` recorded about the checkpoint at ``path``."""
        return read_sidecar(self.resolve(path))

    def annotate(self, path: str, **fields: Any) -> None:
        """Record ``fields`` (JSON values) about the checkpoint at ``path``, beside its files.

        Example::

            store.annotate(uri, expires_at=time.time() + 3600, user_metadata={"step": "10"})
        """
        write_sidecar(self.resolve(path), **fields)

    def run_annotations(self, run_id: str) -> dict[str, Any]:
        """What :meth:`annotate_run` recorded about the training run ``run_id``."""
        return read_sidecar(self.root / "checkpoints" / run_id)

    def annotate_run(self, run_id: str, **fields: Any) -> None:
        """Record ``fields`` about the training run ``run_id`` (its ``user_metadata``), in a
        ``tinker.json`` beside its checkpoint kinds."""
        directory = self.root / "checkpoints" / run_id
        directory.mkdir(parents=True, exist_ok=True)
        write_sidecar(directory, **fields)

    def read_meta(self, path: str) -> CheckpointMeta:
        directory = self.resolve(path)
        raw = json.loads((directory / "meta.json").read_text())
        if not isinstance(raw, dict):
            raise IncompatibleCheckpointError(f"{path!r}: meta.json is not an object")
        return CheckpointMeta.from_json(cast("dict[str, object]", raw), repr(path))

    def load(self, path: str, *, with_optimizer: bool = False) -> LoadedCheckpoint:
        """Read the checkpoint at ``path``; optimizer state only when asked and present."""
        directory = self.resolve(path)
        meta = self.read_meta(path)
        weights = _read_tensors(directory / "weights.safetensors", path)
        optimizer = None
        if with_optimizer:
            if not meta.has_optimizer:
                raise IncompatibleCheckpointError(f"{path!r} holds no optimizer state")
            optimizer = _read_tensors(directory / "optimizer.safetensors", path)
        return LoadedCheckpoint(path=path, meta=meta, weights=weights, optimizer=optimizer)


def _read_tensors(file: Path, path: str) -> dict[str, torch.Tensor]:
    """A safetensors file of a checkpoint; a missing, truncated or corrupt one is named."""
    if not file.is_file():
        raise IncompatibleCheckpointError(f"{path!r}: {file.name} is missing ({file})")
    try:
        return load_file(str(file))
    except Exception as exc:  # safetensors raises its own error type (and OSError)
        raise IncompatibleCheckpointError(
            f"{path!r}: {file} is truncated or corrupt ({exc}); the checkpoint cannot be read"
        ) from exc


def _contiguous_cpu(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
