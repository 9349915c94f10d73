"""Loading models for the local engine: base models, LoRA adapters, devices and dtypes.

A base model is ``"tempering/tiny"`` (the built-in tiny model) or a local directory holding a
Hugging Face causal LM (``config.json`` plus safetensors weights). LoRA adapters come from
``peft``; full fine-tuning trains every parameter.

Device: ``device=`` argument, else ``$TEMPERING_DEVICE``, else CUDA when available, else CPU.
Dtype: ``dtype=`` argument, else ``$TEMPERING_DTYPE``, else bfloat16 on CUDA and float32 on CPU.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar, cast

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from tempering.local._hf import GLOBAL_RNG_LOCK, quiet_progress
from tempering.local.checkpoints import LoraMeta
from tempering.local.errors import ModelLoadError, ModelNotAvailableError
from tempering.local.model_cache import resolve_cached
from tempering.local.tiny import TINY_MODEL, tiny_model_dir
from tempering.model_info import PACKAGED_MODELS

__all__ = [
    "LORA_ALPHA",
    "LORA_DECODE_ENV",
    "LoraDecoding",
    "Placement",
    "adapter_version",
    "apply_lora",
    "decode_copy",
    "frozen_shared_copy",
    "hf_model",
    "inference_copy",
    "load_base_model",
    "load_tokenizer",
    "lora_decoding",
    "lora_targets",
    "move",
    "resolve_model_dir",
    "resolve_placement",
    "sampling_copy",
    "trainable_parameters",
]

_M = TypeVar("_M", bound=nn.Module)

LORA_ALPHA = 32
"""LoRA's alpha; the adapter's output is scaled by ``alpha / rank``."""

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass(frozen=True)
class Placement:
    """Where a model lives and in which dtype."""

    device: torch.device
    dtype: torch.dtype


def resolve_placement(
    device: str | torch.device | None = None, dtype: str | torch.dtype | None = None
) -> Placement:
    """Pick the device and dtype (see the module docstring for the order of precedence)."""
    chosen = device if device is not None else os.environ.get("TEMPERING_DEVICE") or None
    if chosen is None:
        chosen = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(chosen)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {chosen!r} requested but CUDA is not available")
    wanted = dtype if dtype is not None else os.environ.get("TEMPERING_DTYPE") or None
    if wanted is None:
        dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    elif isinstance(wanted, torch.dtype):
        dt = wanted
    else:
        if wanted.lower() not in _DTYPES:
            raise ValueError(f"unknown dtype {wanted!r}; use one of {sorted(_DTYPES)}")
        dt = _DTYPES[wanted.lower()]
    return Placement(device=dev, dtype=dt)


def resolve_model_dir(base_model: str, root: Path) -> Path:
    """The directory of ``base_model``: the tiny model (built once under ``root``), a model
    directory, or what the model cache under ``root`` provides (a packaged model by its short or
    hub name, pulled on first use; a ``.gguf`` file or a directory holding one, converted once;
    :mod:`tempering.local.model_cache`)."""
    if base_model == TINY_MODEL:
        return tiny_model_dir(root)
    path = Path(base_model).expanduser()
    if (path / "config.json").is_file():
        return path.resolve()
    cached = resolve_cached(base_model, root)
    if cached is not None:
        return cached
    raise ModelNotAvailableError(
        f"base model {base_model!r}: not {TINY_MODEL!r}, not a directory with a config.json, not a "
        f".gguf file and not a model tempering can pull ({', '.join(PACKAGED_MODELS)}; "
        "docs/models.md). The local engine does not download other hub models: download one "
        "(huggingface-cli download NAME --local-dir DIR) and give DIR as base_model"
    )


def load_base_model(model_dir: Path, placement: Placement, *, on_cpu: bool = False) -> PreTrainedModel:
    """Load the causal LM in ``model_dir`` in ``placement``'s dtype, in eval mode (no dropout);
    on ``placement``'s device, or on the CPU with ``on_cpu`` (to add an adapter first)."""
    try:
        with quiet_progress():
            model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(model_dir, dtype=placement.dtype)
    except Exception as exc:  # transformers raises many types; name the directory in one
        raise ModelLoadError(f"could not load a causal LM from {model_dir}: {exc}") from exc
    if not on_cpu:
        move(model, placement.device)
    model.eval()
    return model


def move(module: nn.Module, device: torch.device) -> None:
    """Move ``module`` to ``device`` in place."""
    # PreTrainedModel.to is wrapped with functools.wraps, which hides its bound signature.
    nn.Module.to(module, device)


def hf_model(model: nn.Module) -> PreTrainedModel:
    """The Hugging Face model inside ``model`` (itself, or the base of a LoRA wrapper)."""
    inner = model.get_base_model() if isinstance(model, PeftModel) else model
    if not isinstance(inner, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel, got {type(inner).__name__}")
    return inner


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    """The Hugging Face tokenizer saved with the model."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except Exception as exc:
        raise ModelLoadError(f"could not load a tokenizer from {model_dir}: {exc}") from exc
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise ModelLoadError(f"{model_dir} did not load as a transformers tokenizer")
    return tokenizer


def lora_targets(
    model: PreTrainedModel, *, train_mlp: bool, train_attn: bool, train_unembed: bool
) -> tuple[str, ...]:
    """Names of the linear layers a LoRA adapter covers, chosen as the hosted service does:
    attention projections, MLP projections and the unembedding, each switchable."""
    unembed = model.get_output_embeddings()
    targets: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if module is unembed:
            if train_unembed:
                targets.append(name)
            continue
        parts = name.lower().split(".")
        is_attn = any("attn" in p or "attention" in p for p in parts)
        is_mlp = not is_attn and any(
            "mlp" in p or "ffn" in p or "feed_forward" in p or "expert" in p for p in parts
        )
        if (is_attn and train_attn) or (is_mlp and train_mlp):
            targets.append(name)
    if not targets:
        raise ValueError(
            "this LoRA configuration covers no layer: enable train_mlp, train_attn or train_unembed"
        )
    return tuple(targets)


def apply_lora(model: PreTrainedModel, lora: LoraMeta, seed: int) -> PeftModel:
    """Wrap ``model`` in a LoRA adapter (A initialised from ``seed``, B zero); freezes the base.

    The initialisation depends on ``seed`` alone: A is drawn from a ``torch.Generator`` of this
    call's own (on the CPU, in float32, then copied in), never from torch's process-global RNG,
    so models built on concurrent threads (``tempering serve``) get the same adapter as one built
    alone, on any device and dtype."""
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=0.0,
        target_modules=list(lora.target_modules),
        bias="none",
    )
    # peft draws its own initialisation from the global RNG; it is overwritten below. The lock
    # and fork_rng only keep that draw from disturbing other users of the global RNG.
    with GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # With tied embeddings peft warns that merging a LoRA on the unembedding would also
        # change the embedding; inference_copy unties the two before merging.
        warnings.filterwarnings(
            "ignore", message=r"Model has `tie_word_embeddings=True`", category=UserWarning
        )
        # peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing`; harmless.
        warnings.filterwarnings(
            "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        peft_model = get_peft_model(model, config)
    _init_lora(peft_model, torch.Generator(device="cpu").manual_seed(seed))
    peft_model.eval()
    return peft_model


def _init_lora(model: nn.Module, generator: torch.Generator) -> None:
    """Initialise every LoRA adapter of ``model`` as peft's default does (A: Kaiming-uniform as
    ``nn.Linear``, B: zero; for embeddings A zero, B standard normal), drawing from
    ``generator`` in module order."""

    def fill(param: object, init: Callable[[torch.Tensor], object]) -> None:
        if not isinstance(param, torch.Tensor):
            raise TypeError(f"a LoRA weight is a {type(param).__name__}, not a tensor")
        values = torch.empty(param.shape, dtype=torch.float32)
        init(values)
        with torch.no_grad():
            param.copy_(values)

    def kaiming(t: torch.Tensor) -> object:
        return nn.init.kaiming_uniform_(t, a=math.sqrt(5), generator=generator)

    def zero(t: torch.Tensor) -> object:
        return t.zero_()

    def normal(t: torch.Tensor) -> object:
        return nn.init.normal_(t, generator=generator)

    for module in model.modules():
        if not isinstance(module, LoraLayer):
            continue
        for name in sorted(module.lora_A.keys()):
            fill(module.lora_A[name].weight, kaiming)
            fill(module.lora_B[name].weight, zero)
        for name in sorted(module.lora_embedding_A.keys()):
            fill(module.lora_embedding_A[name], zero)
            fill(module.lora_embedding_B[name], normal)


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters training updates, by name (LoRA's A and B, or every parameter)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def frozen_shared_copy(module: _M) -> _M:
    """A copy of ``module`` whose frozen parameters (``requires_grad=False``) are the same
    tensors as the original's: only the module tree and the trainable parameters are copied."""
    memo: dict[int, object] = {id(p): p for p in module.parameters() if not p.requires_grad}
    return copy.deepcopy(module, memo)


def sampling_copy(model: nn.Module) -> nn.Module:
    """Frozen weights to sample from, as they are now, sharing everything that cannot change.

    - A model with nothing to train (a frozen base model) is returned as it is.
    - A LoRA model gets a structural copy whose frozen base parameters are the same tensors
      (nothing ever writes to them) and whose adapter weights are copies: the snapshot costs
      the adapter's memory, not the model's. How decoding applies the adapter (merged into a
      copy of the adapted weights, or cast to the model's dtype) is :func:`lora_decoding`'s
      choice; that copy is made when the sampler first decodes.
    - A fully trained model is copied whole (every weight moves on with training).
    """
    trained = [p for p in model.parameters() if p.requires_grad]
    if not trained:
        model.eval()
        return model
    snapshot = frozen_shared_copy(model) if isinstance(model, PeftModel) else copy.deepcopy(model)
    snapshot.requires_grad_(False)
    snapshot.eval()
    return snapshot


def inference_copy(model: nn.Module, *, share_unadapted: bool = False) -> nn.Module:
    """A frozen copy of ``model`` with any LoRA adapter merged into the weights.

    - ``share_unadapted=False`` (export): every tensor is copied.
    - ``share_unadapted=True`` (a sampler's decode weights, ``SamplerModel.decode_model``): the
      weights no adapter changes (embeddings, norms, untargeted projections) are the original's
      tensors, so the copy costs the adapted projections only.

    A tied unembedding with an adapter is untied in the copy, so that merging its adapter leaves
    the embedding alone.
    """
    snapshot = frozen_shared_copy(model) if share_unadapted else copy.deepcopy(model)
    if isinstance(snapshot, PeftModel):
        base = hf_model(snapshot)
        unembed = base.get_output_embeddings()
        embed = base.get_input_embeddings()
        inner = getattr(unembed, "base_layer", None)
        own: set[int] = set()  # weights of this copy's own (merging writes into them)
        if isinstance(inner, nn.Linear) and isinstance(embed, nn.Embedding) and inner.weight is embed.weight:
            # peft checks the config for tied weights: say so there too.
            inner.weight = nn.Parameter(inner.weight.detach().clone(), requires_grad=False)
            base.config.tie_word_embeddings = False
            own.add(id(inner.weight))
        if share_unadapted:
            for module in snapshot.modules():
                if isinstance(module, LoraLayer):
                    layer = module.get_base_layer()
                    weight = cast(torch.Tensor, layer.weight)
                    if id(weight) not in own:
                        layer.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
                        own.add(id(layer.weight))
        merged = snapshot.merge_and_unload()
        if not isinstance(merged, nn.Module):
            raise TypeError("peft merge_and_unload did not return a module")
        snapshot = merged
    snapshot.requires_grad_(False)
    snapshot.eval()
    return snapshot


LORA_DECODE_ENV = "TEMPERING_LORA_DECODE"
"""How a LoRA sampler applies its adapter when it decodes (:func:`lora_decoding`): ``auto``
(default), ``merge``, ``cast`` or ``as-trained``."""

LoraDecoding = Literal["merge", "cast", "as-trained"]
_LORA_DECODINGS = ("merge", "cast", "as-trained")


def lora_decoding(model: nn.Module) -> LoraDecoding:
    """How a sampler of ``model`` (a snapshot) applies its adapter at decode time.

    - ``merge``: the adapter merged into a copy of the adapted weights, so a decoded token costs
      what the base model's does. ``auto`` merges float32 and float64 models, where it is
      exact to rounding.
    - ``cast``: the adapter kept apart, in the model's dtype. ``auto`` casts in half precision,
      where merging would round ``W + BA`` to bfloat16 and lose any adapter update smaller than
      half a unit in the last place of ``W`` (early in training, nearly all of it), while the
      trainer computes the adapter in float32. In the adapter's own products bfloat16 costs
      about 2^-8 of the update, not of the weight.
    - ``as-trained``: the adapter as the trainer holds it (PEFT keeps it in float32).

    ``$TEMPERING_LORA_DECODE`` chooses (``auto`` by default); a model without an adapter is
    always decoded as it is.
    """
    setting = os.environ.get(LORA_DECODE_ENV, "auto").strip().lower()
    if setting != "auto" and setting not in _LORA_DECODINGS:
        raise ValueError(f"${LORA_DECODE_ENV}={setting!r}: use auto, merge, cast or as-trained")
    if not isinstance(model, PeftModel):
        return "as-trained"
    if setting != "auto":
        return setting
    adapter = [p.dtype for name, p in model.named_parameters() if "lora_" in name]
    base = [p.dtype for name, p in model.named_parameters() if "lora_" not in name]
    if all(d in (torch.float32, torch.float64) for d in adapter + base):
        return "merge"
    return "cast" if set(adapter) - set(base) else "as-trained"


def decode_copy(model: nn.Module, how: LoraDecoding) -> nn.Module:
    """The weights a sampler of ``model`` decodes with (see :func:`lora_decoding`): a merged
    copy sharing the unadapted weights, a copy whose adapter is cast to its base layer's dtype
    (sharing every base weight), or ``model`` itself."""
    if how == "merge":
        return inference_copy(model, share_unadapted=True)
    if how == "as-trained" or not isinstance(model, PeftModel):
        return model
    copied = frozen_shared_copy(model)  # a snapshot's adapter is frozen too: shared until replaced
    for module in copied.modules():
        if isinstance(module, LoraLayer):
            dtype = cast(torch.Tensor, module.get_base_layer().weight).dtype
            for adapters in (module.lora_A, module.lora_B):
                for linear in adapters.values():
                    weight = cast(torch.Tensor, linear.weight)
                    linear.weight = nn.Parameter(weight.detach().to(dtype), requires_grad=False)
    copied.eval()
    return copied


def adapter_version(model: nn.Module) -> tuple[int, ...]:
    """A key that changes whenever an adapter weight of ``model`` is written in place (torch
    counts in-place writes per tensor), so weights merged from it can tell they are stale."""
    return tuple(int(getattr(p, "_version", 0)) for name, p in model.named_parameters() if "lora_" in name)
