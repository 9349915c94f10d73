"""A checkpoint given by the user (a run directory, sampler weights or a ``save_state`` path),
resolved to sampler weights and opened as a sampling client, with errors that name the flag.

Example::

    path = await sampler_weights(service, "runs/demo/rl", "--teacher")    # last checkpoint's weights
    teacher = await open_sampler(service, path, "--teacher")
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tempering.backend import ServiceClient
from tempering_protocols import SamplingClient

__all__ = ["is_state_path", "open_sampler", "sampler_weights"]


def is_state_path(path: str) -> bool:
    """``save_state`` paths (``tinker://…/weights/…``, ``tempering://…/weights/…``) hold
    training state; sampler weights live under ``sampler_weights/``."""
    return "/weights/" in path and "/sampler_weights/" not in path


def _from_run_dir(path: Path, what: str) -> str:
    """The sampler path (else state path) of the last entry of a run directory's checkpoints."""
    index = path / "checkpoints.jsonl"
    lines = [line for line in index.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{what}: {index} has no checkpoint (did the run finish a step?)")
    record: Mapping[str, Any] = json.loads(lines[-1])
    sampler = record.get("sampler_path")
    return str(sampler if sampler else record["state_path"])


async def sampler_weights(service: ServiceClient, path: str, what: str) -> str:
    """A sampler-weights path for ``path``: a run directory's last checkpoint, a sampler path
    as is, or a ``save_state`` path turned into sampler weights (through a training client).
    ``what`` (e.g. the flag) names the checkpoint in errors and in the saved weights' name.

    Example::

        await sampler_weights(service, "tempering://run-x/weights/final", "--init-state")
    """
    local = Path(path).expanduser()
    if local.is_dir() and (local / "checkpoints.jsonl").is_file():
        path = _from_run_dir(local, what)
    elif local.is_dir() and not (local / "meta.json").is_file():
        raise ValueError(
            f"{what}: {path!r} is a directory but neither a run directory (no checkpoints.jsonl) "
            "nor a checkpoint directory (no meta.json)"
        )
    if not is_state_path(path):
        return path
    client = await service.create_training_client_from_state(path)
    name = "".join(c if c.isalnum() else "-" for c in what).strip("-")
    saved = await client.save_weights_for_sampler(f"{name}-sampler")
    return saved.path


async def open_sampler(service: ServiceClient, path: str, what: str) -> SamplingClient:
    """A sampling client of the sampler weights at ``path``; a ``ValueError`` naming ``what``
    and the path when they do not load."""
    try:
        return await service.create_sampling_client(model_path=path)
    except Exception as exc:
        raise ValueError(f"{what}: could not load the checkpoint {path!r}: {exc}") from exc
