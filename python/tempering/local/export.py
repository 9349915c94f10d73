"""Weights out of tempering: a local checkpoint as a Hugging Face model or a PEFT adapter.

:func:`export_checkpoint` reads a checkpoint of the local engine (a ``tempering://`` path or a
checkpoint directory), rebuilds its model on the CPU in float32 from the base model the
checkpoint names, and writes either

- a **Hugging Face model directory** (the default): any LoRA adapter merged into the base
  weights; ``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer's
  files and a ``README.md`` model card with the checkpoint's provenance and, when given, the
  training run's config. It loads with ``transformers.AutoModelForCausalLM.from_pretrained``;
- or, with ``adapter=True``, a **PEFT adapter directory** (``adapter_config.json``,
  ``adapter_model.safetensors``) for ``peft.PeftModel.from_pretrained`` on the base model,
  whose directory the adapter's config names. Only a LoRA checkpoint has an adapter.

Nothing is half-written: the files go to a scratch directory beside ``out_dir``, which is
renamed into place at the end. An existing non-empty ``out_dir`` is refused unless
``overwrite=True``.

Example::

    from tempering.local.export import export_checkpoint
    export_checkpoint("tempering://run-1f2e/weights/final", "exported/")
    model = transformers.AutoModelForCausalLM.from_pretrained("exported/")
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import PeftModel
from torch import nn
from transformers import PreTrainedTokenizerBase

from tempering.local.checkpoints import CheckpointMeta, CheckpointStore, staged_dir
from tempering.local.errors import IncompatibleCheckpointError, LocalEngineError
from tempering.local.model import (
    Placement,
    apply_lora,
    hf_model,
    inference_copy,
    load_base_model,
    load_tokenizer,
    resolve_model_dir,
    trainable_parameters,
)
from tempering.local.tiny import TINY_MODEL

__all__ = [
    "ExportError",
    "ExportedModel",
    "check_out_dir",
    "export_checkpoint",
    "export_downloaded",
    "load_checkpoint_model",
]


class ExportError(LocalEngineError, ValueError):
    """An export that cannot be done as asked (the message says why and what to do)."""


@dataclass(frozen=True)
class ExportedModel:
    """What :func:`export_checkpoint` wrote."""

    out_dir: Path
    kind: str
    """``"model"`` (a merged Hugging Face model) or ``"adapter"`` (a PEFT adapter)."""
    base_model: str
    base_model_dir: Path
    files: tuple[str, ...]


def load_checkpoint_model(
    path: str, store: CheckpointStore | None = None
) -> tuple[nn.Module, CheckpointMeta, Path, PreTrainedTokenizerBase]:
    """The model a checkpoint holds, on the CPU in float32: a ``PeftModel`` for a LoRA
    checkpoint, the fine-tuned ``PreTrainedModel`` otherwise; with the checkpoint's metadata,
    the base model's directory and its tokenizer."""
    store = store if store is not None else CheckpointStore()
    checkpoint = store.load(path)
    meta = checkpoint.meta
    model_dir = resolve_model_dir(meta.base_model, store.root)
    placement = Placement(device=torch.device("cpu"), dtype=torch.float32)
    model: nn.Module = load_base_model(model_dir, placement, on_cpu=True)
    if meta.lora is not None:
        model = apply_lora(hf_model(model), meta.lora, seed=0)
    params = trainable_parameters(model) if meta.lora is not None else dict(model.named_parameters())
    missing = sorted(set(checkpoint.weights) - set(params))
    if missing:
        raise IncompatibleCheckpointError(
            f"{path!r} does not fit its base model {meta.base_model!r} ({model_dir}): "
            f"the model has no parameter {missing[0]!r}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; was the base model directory replaced since the checkpoint was saved?"
        )
    if meta.lora is not None and set(params) != set(checkpoint.weights):
        absent = sorted(set(params) - set(checkpoint.weights))
        raise IncompatibleCheckpointError(f"{path!r} lacks the adapter weights {absent[:3]}")
    with torch.no_grad():
        for name, tensor in checkpoint.weights.items():
            target = params[name]
            if tuple(tensor.shape) != tuple(target.shape):
                raise IncompatibleCheckpointError(
                    f"{path!r}: {name} has shape {tuple(tensor.shape)}, the base model "
                    f"{meta.base_model!r} has {tuple(target.shape)}"
                )
            target.copy_(tensor.to(torch.float32))
    model.eval()
    return model, meta, model_dir, load_tokenizer(model_dir)


def export_checkpoint(
    path: str,
    out_dir: str | os.PathLike[str],
    *,
    adapter: bool = False,
    store: CheckpointStore | None = None,
    run_config: Mapping[str, object] | None = None,
    overwrite: bool = False,
) -> ExportedModel:
    """Write the checkpoint at ``path`` to ``out_dir`` (see the module docstring)."""
    out = check_out_dir(out_dir, overwrite)
    model, meta, model_dir, tokenizer = load_checkpoint_model(path, store)
    if adapter and not isinstance(model, PeftModel):
        raise ExportError(
            f"{path!r} is a full fine-tune (no LoRA adapter); export it without --adapter "
            "to get the whole model"
        )
    card = _model_card(path, meta, model_dir, adapter=adapter, run_config=run_config)
    files = _write_model(model, model_dir, tokenizer, out, adapter=adapter, card=card)
    return ExportedModel(
        out_dir=out,
        kind="adapter" if adapter else "model",
        base_model=meta.base_model,
        base_model_dir=model_dir,
        files=files,
    )


def check_out_dir(out_dir: str | os.PathLike[str], overwrite: bool) -> Path:
    """``out_dir`` resolved; refused (:class:`ExportError`) when it holds files, unless ``overwrite``."""
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ExportError(f"{out} exists and is not empty; choose another directory, or overwrite it")
    return out


def _write_model(
    model: nn.Module,
    model_dir: Path,
    tokenizer: PreTrainedTokenizerBase,
    out: Path,
    *,
    adapter: bool,
    card: str,
) -> tuple[str, ...]:
    """Write ``model`` (its adapter alone, or merged) and ``card`` into a scratch directory
    beside ``out``, then rename it into place; return the file names."""
    with staged_dir(out, prefix=f".{out.name}-export-") as scratch:
        if adapter:
            assert isinstance(model, PeftModel)
            model.peft_config["default"].base_model_name_or_path = str(model_dir)
            # The base weights are unchanged (the base model's directory has them): save the
            # adapter alone, even when it covers the unembedding.
            model.save_pretrained(str(scratch), safe_serialization=True, save_embedding_layers=False)
        else:
            merged = hf_model(inference_copy(model))
            merged.save_pretrained(scratch, safe_serialization=True)
            merged.generation_config.save_pretrained(scratch)
            tokenizer.save_pretrained(scratch)
        (scratch / "README.md").write_text(card, encoding="utf-8")
        files = tuple(sorted(p.name for p in scratch.iterdir()))
    return files


def export_downloaded(
    source: Path,
    out_dir: str | os.PathLike[str],
    *,
    origin: str,
    base_model: str,
    adapter: bool = False,
    store_root: Path | None = None,
    run_config: Mapping[str, object] | None = None,
    overwrite: bool = False,
) -> ExportedModel:
    """Export weights downloaded in Hugging Face format (``source``: a PEFT adapter directory,
    as ``save_weights_external`` writes for a LoRA run) the way :func:`export_checkpoint` does.

    The adapter goes onto the base model its config names when that directory exists here,
    else onto ``base_model`` (``tempering/tiny``, a local directory, or a Hugging Face hub
    name, which transformers downloads). ``origin`` (the ``tinker://`` path) goes in the card.
    """
    out = check_out_dir(out_dir, overwrite)
    config_file = source / "adapter_config.json"
    if not config_file.is_file():
        raise ExportError(
            f"the weights downloaded for {origin} are not a PEFT adapter (no adapter_config.json "
            f"among {sorted(p.name for p in source.iterdir())}); only LoRA runs export this way"
        )
    config = json.loads(config_file.read_text(encoding="utf-8"))
    named = str(config.get("base_model_name_or_path") or "") if isinstance(config, dict) else ""
    model_dir = _base_model_dir(named, base_model, store_root)
    placement = Placement(device=torch.device("cpu"), dtype=torch.float32)
    base = load_base_model(model_dir, placement, on_cpu=True)
    try:
        with warnings.catch_warnings():  # peft on transformers 5 asks a deprecated attribute
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            model = PeftModel.from_pretrained(base, str(source))
    except Exception as exc:  # peft raises many types; name the download in one
        raise IncompatibleCheckpointError(
            f"the adapter downloaded for {origin} does not fit its base model {model_dir}: {exc}"
        ) from exc
    model.eval()
    lines = [
        f"- checkpoint: `{origin}` (downloaded through the tinker SDK's REST client)",
        f"- base model: `{base_model}` (from `{model_dir}`)",
        f"- training: LoRA rank {config.get('r')}, alpha {config.get('lora_alpha')}",
    ]
    card = _card_text(lines, adapter=adapter, run_config=run_config)
    files = _write_model(model, model_dir, load_tokenizer(model_dir), out, adapter=adapter, card=card)
    kind = "adapter" if adapter else "model"
    return ExportedModel(out_dir=out, kind=kind, base_model=base_model, base_model_dir=model_dir, files=files)


def _base_model_dir(named: str, base_model: str, store_root: Path | None) -> Path:
    """Where the base model is: the adapter's own reference when that directory is here, else
    ``base_model`` resolved as the local engine does (or left as a hub name)."""
    if named and (Path(named).expanduser() / "config.json").is_file():
        return Path(named).expanduser().resolve()
    root = store_root if store_root is not None else CheckpointStore().root
    try:
        return resolve_model_dir(base_model, root)
    except LocalEngineError:
        return Path(base_model)  # a hub name: transformers downloads it


def _model_card(
    path: str,
    meta: CheckpointMeta,
    model_dir: Path,
    *,
    adapter: bool,
    run_config: Mapping[str, object] | None,
) -> str:
    base = meta.base_model if meta.base_model != TINY_MODEL else f"{TINY_MODEL} (built-in tiny model)"
    training = (
        f"LoRA rank {meta.lora.rank}, alpha {meta.lora.alpha}, on {len(meta.lora.target_modules)} layers"
        if meta.lora is not None
        else "full fine-tuning"
    )
    lines = [
        f"- checkpoint: `{path}` ({meta.kind}, after {meta.optimizer_steps} optimizer steps)",
        f"- base model: `{base}` (from `{model_dir}`)",
        f"- training: {training}",
    ]
    return _card_text(lines, adapter=adapter, run_config=run_config)


def _card_text(provenance: list[str], *, adapter: bool, run_config: Mapping[str, object] | None) -> str:
    what = (
        "a PEFT LoRA adapter; load it onto the base model with `peft.PeftModel.from_pretrained`"
        if adapter
        else "a Hugging Face causal LM (any adapter merged into the weights); load it with "
        "`transformers.AutoModelForCausalLM.from_pretrained`"
    )
    lines = [
        "---",
        "library_name: " + ("peft" if adapter else "transformers"),
        "tags: [tempering]",
        "---",
        "",
        "# Exported by tempering",
        "",
        f"This directory is {what}.",
        "",
        *provenance,
    ]
    if run_config is not None:
        lines += ["", "## Training run config", "", "```json", json.dumps(run_config, indent=2), "```"]
    return "\n".join(lines) + "\n"
