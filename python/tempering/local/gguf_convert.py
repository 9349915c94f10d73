"""GGUF files into Hugging Face model directories: read, check, dequantize, save as safetensors.

transformers' GGUF loader (``from_pretrained(dir, gguf_file=name)``, with the ``gguf`` package)
dequantizes a GGUF file into an ordinary model with its tokenizer and chat template. A model
loaded that way refuses ``save_pretrained`` (it is marked as quantized), so its state dict is
loaded into a fresh model of the same config, which saves as safetensors in float32.

Before the slow part, the file's header is read: a truncated or corrupted file raises
:class:`~tempering.local.errors.CorruptModelError`, and a tensor of a quantization type the
``gguf`` package cannot dequantize (``Q8_1``, ``Q8_K``, …) or an architecture transformers does
not map raises :class:`~tempering.local.errors.UnsupportedGGUFError` naming it.

Example::

    info = convert_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"), Path("/tmp/smollm2"))
    info.architecture     # "llama"
    info.quantization     # ("F32", "Q4_1")
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from tempering.local._hf import quiet_progress
from tempering.local.errors import CorruptModelError, UnsupportedGGUFError

__all__ = ["GGUFSummary", "convert_gguf", "file_sha256", "read_gguf", "supported_architectures"]

_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """The sha256 of the file at ``path``, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class GGUFSummary:
    """What a GGUF file's header says: its architecture, model name and tensor types."""

    architecture: str
    model_name: str
    quantization: tuple[str, ...]
    """The distinct storage types of its tensors, sorted (``("F32", "Q4_1")``)."""
    tensors: int


def supported_architectures() -> tuple[str, ...]:
    """The GGUF architectures this transformers can dequantize into a model."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return tuple(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))


def read_gguf(path: Path) -> GGUFSummary:
    """Read ``path``'s header and check that every tensor's type can be dequantized.

    Raises :class:`CorruptModelError` for a file that is not a whole GGUF file, and
    :class:`UnsupportedGGUFError` naming a quantization type that cannot be dequantized."""
    import numpy as np
    from gguf import GGUFReader, dequantize

    try:
        reader = GGUFReader(path)
        arch_field = reader.get_field("general.architecture")
        architecture = str(arch_field.contents()) if arch_field is not None else ""
        name_field = reader.get_field("general.name")
        model_name = str(name_field.contents()) if name_field is not None else ""
        missing = [k for k in _required_fields(architecture) if reader.get_field(k) is None]
        first_of_type: dict[str, np.ndarray] = {}
        types: dict[str, object] = {}
        for tensor in reader.tensors:
            kind = tensor.tensor_type.name
            if kind not in first_of_type:
                first_of_type[kind] = np.asarray(tensor.data)
                types[kind] = tensor.tensor_type
    except (ValueError, IndexError, KeyError, OSError, TypeError, AssertionError) as exc:
        raise CorruptModelError(
            f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc}); it is truncated or "
            "corrupted: download it again (or re-pull the model: tempering models pull NAME)"
        ) from exc
    if not architecture:
        raise CorruptModelError(f"{path} has no general.architecture field: not a model GGUF file")
    if not types:
        raise CorruptModelError(f"{path} holds no tensors: not a model GGUF file")
    if not _maps(architecture):
        raise UnsupportedGGUFError(_unsupported_architecture(path, architecture))
    from gguf import GGMLQuantizationType

    for kind, data in first_of_type.items():
        qtype = types[kind]
        assert isinstance(qtype, GGMLQuantizationType)
        try:
            dequantize(data.reshape(-1).view(np.uint8)[: _block_bytes(qtype)], qtype)
        except NotImplementedError:
            raise UnsupportedGGUFError(
                f"{path}: quantization type {kind} (architecture {architecture}) cannot be "
                "dequantized by the gguf package; use a GGUF of another quantization (Q4_0, Q4_1, "
                "Q5_K, Q8_0, F16, …) of the same model"
            ) from None
    if missing:
        # transformers would fill the gaps with its defaults: a 7B-parameter Llama, say.
        raise UnsupportedGGUFError(
            f"{path}: this {architecture!r} GGUF lacks {', '.join(missing)}; a model file written "
            "by llama.cpp's converter has them. Use a complete GGUF or the model's Hugging Face release"
        )
    return GGUFSummary(
        architecture=architecture,
        model_name=model_name,
        quantization=tuple(sorted(types)),
        tensors=len(reader.tensors),
    )


def _required_fields(architecture: str) -> tuple[str, ...]:
    """The metadata a model GGUF must have for transformers to size the model from it."""
    return (f"{architecture}.block_count", f"{architecture}.embedding_length", "tokenizer.ggml.tokens")


def _maps(architecture: str) -> bool:
    """Whether transformers maps ``architecture`` (its own renames: ``qwen2moe``, ``gpt-oss``,
    ``t5encoder`` …); transformers has the last word when loading."""
    supported = supported_architectures()
    name = architecture.replace("-", "_")
    return name in supported or name.replace("moe", "_moe") in supported or name.startswith("t5")


def _unsupported_architecture(path: Path, architecture: str) -> str:
    return (
        f"{path}: GGUF architecture {architecture!r} is not one transformers can dequantize (it maps "
        f"{', '.join(supported_architectures())}); use the model's Hugging Face release, or a GGUF "
        "of a supported architecture"
    )


def _block_bytes(qtype: object) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    assert isinstance(qtype, GGMLQuantizationType)
    _, type_size = GGML_QUANT_SIZES[qtype]
    return type_size


def convert_gguf(path: Path, out_dir: Path) -> GGUFSummary:
    """Dequantize the GGUF file ``path`` into a Hugging Face model directory ``out_dir``
    (``config.json``, float32 ``model.safetensors``, tokenizer files, ``chat_template.jinja``).

    ``out_dir`` should be a scratch directory: on an error it may hold part of the output."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM, AutoTokenizer

    summary = read_gguf(path)
    try:
        with quiet_progress():
            # The model first: transformers checks the architecture there.
            loaded = AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except ValueError as exc:
        if "not supported" in str(exc) and "architecture" in str(exc):
            raise UnsupportedGGUFError(_unsupported_architecture(path, summary.architecture)) from None
        # The header read fine (read_gguf), so this is a model transformers does not load as a
        # causal LM (an encoder, a layout it does not map), not a damaged file.
        raise UnsupportedGGUFError(
            f"{path}: transformers could not load this {summary.architecture!r} GGUF as a causal "
            f"language model ({exc}); use the model's Hugging Face release"
        ) from exc
    except (OSError, KeyError, RuntimeError, TypeError) as exc:
        raise CorruptModelError(
            f"{path}: transformers could not load this GGUF file ({type(exc).__name__}: {exc}); "
            "it may be truncated or corrupted: download it again"
        ) from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.architectures = [type(loaded).__name__]
    fresh = type(loaded)(config)
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    fresh.generation_config = loaded.generation_config
    nn.Module.to(fresh, torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    with quiet_progress():
        fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return summary
