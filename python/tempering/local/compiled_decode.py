"""The static decoder's layers compiled with ``torch.compile``: one decoder layer's decode step
as a function of plain tensors, compiled once and run for every layer.

Why: a one-token decode step on a CPU spends as much time dispatching small operators (norms,
rotary embedding, residual adds, the softmax, the activation: about 150 of them per layer) as in
its matrix products. Inductor fuses the elementwise work into a few generated kernels, so a step
is mostly its matrix products.

How: a layer's weights are read out of its modules once (:func:`layer_tensors`): the base
weights, any bias, and any unmerged LoRA adapter (``lora_A``, ``lora_B``, its scaling), as a flat
tuple. The layer's arithmetic (:func:`_layer`) is that of the Hugging Face modules it replaces
(Llama-family RMSNorm computed in float32, rotary embedding, grouped-query attention with float32
scores, gated SiLU MLP, PEFT's LoRA computed in the adapter's dtype), so float32 logprobs agree
with the module path to float rounding. Every layer of a model has the same structure and
shapes, so the compiled graph is shared by all of them; the number of rows, slots and cache
positions are dynamic.

When: :func:`compile_wanted` (``TEMPERING_COMPILE_DECODE``: ``1`` always, ``0`` never, unset or
``auto``: on the CPU, in bfloat16 or float16, for models of at least :data:`AUTO_MIN_PARAMETERS`
parameters, where the first compilation, tens of seconds, pays for itself within a few hundred
decoded rows). A layer
whose modules are not of the recognised kinds (another norm, a LoRA variant such as DoRA, an
adapter bias, several active adapters, another activation) keeps the module path; so does a
process where compilation fails (no C++ compiler, say): a warning names the error once.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch._dynamo.config as dynamo_config
import torch.fx.experimental._config as fx_config
from torch import nn
from torch.nn import functional

__all__ = ["AUTO_DTYPES", "AUTO_MIN_PARAMETERS", "COMPILE_ENV", "CompiledLayers", "compile_wanted"]

COMPILE_ENV = "TEMPERING_COMPILE_DECODE"
"""``1``: compile the decode step's layers; ``0``: never; ``auto`` (default): see
:func:`compile_wanted`."""

AUTO_MIN_PARAMETERS = 20_000_000
"""With ``auto``, models with fewer parameters decode without compiling (the compilation would
cost more than it saves; the built-in test model is one of them)."""

AUTO_DTYPES = frozenset({torch.bfloat16, torch.float16})
"""With ``auto``, the dtypes compiled: in float32 a step is matrix products already (compiling
gained 1% on SmolLM2-135M, 64 rows), and not worth a compilation."""

_RMS_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"})
"""Norm classes whose forward is ``weight * (x.float() * rsqrt(mean(x²) + eps)).to(x.dtype)``."""

_PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")

_failed: list[str] = []
"""The compilation error of this process, once one happened (then nothing is compiled again)."""


def compile_wanted(model: nn.Module, device: torch.device) -> bool:
    """Whether the static decoder should compile its layers for ``model`` on ``device``."""
    setting = os.environ.get(COMPILE_ENV, "auto").strip().lower()
    if setting not in {"0", "1", "auto"}:
        raise ValueError(f"{COMPILE_ENV}={setting!r}: expected 1, 0 or auto")
    if setting == "0" or _failed:
        return False
    if setting == "1":
        return True
    params = list(model.parameters())
    half = bool(params) and params[0].dtype in AUTO_DTYPES
    return device.type == "cpu" and half and sum(p.numel() for p in params) >= AUTO_MIN_PARAMETERS


@dataclass(frozen=True)
class _Spec:
    """What a layer's arithmetic depends on besides its tensors (the compiled graph's constants)."""

    heads: int
    kv_heads: int
    head_dim: int
    norm_eps: tuple[float, float]
    qk_eps: float | None
    scaling: float
    bias: tuple[bool, ...]
    """Per projection (:data:`_PROJECTIONS`): whether it has a bias."""
    lora: tuple[float | None, ...]
    """Per projection: its adapter's scaling, or None without an adapter."""


_Projection = tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor, float] | None]
"""A projection's weight, bias and adapter (``lora_A``, ``lora_B``, scaling)."""


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _layer(
    spec: _Spec,
    prefix: bool,
    h: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    bias_A_1_1_C: torch.Tensor,
    k_S: torch.Tensor,
    v_S: torch.Tensor,
    slot_A: torch.Tensor,
    pos_A: torch.Tensor,
    top: int,
    tensors: tuple[torch.Tensor, ...],
) -> torch.Tensor:
    """One decoder layer for one new token per active row (see
    :meth:`tempering.local.fastdecode.StaticKV.step`, whose module path computes the same):
    writes the rows' keys and values into the slot caches and returns the new hidden states."""
    it = iter(tensors)
    norm1, norm2 = next(it), next(it)
    q_norm, k_norm = (next(it), next(it)) if spec.qk_eps is not None else (None, None)
    proj: list[_Projection] = []
    for has_bias, lora in zip(spec.bias, spec.lora, strict=True):
        weight = next(it)
        bias = next(it) if has_bias else None
        proj.append((weight, bias, (next(it), next(it), lora) if lora is not None else None))
    q_p, k_p, v_p, o_p, gate_p, up_p, down_p = proj
    A, D = h.shape[0], spec.head_dim
    x = _rms(h, norm1, spec.norm_eps[0])
    q = _project(x, *q_p).view(A, 1, spec.heads, D)
    k = _project(x, *k_p).view(A, 1, spec.kv_heads, D)
    v = _project(x, *v_p).view(A, 1, spec.kv_heads, D)
    if q_norm is not None and k_norm is not None and spec.qk_eps is not None:
        q, k = _rms(q, q_norm, spec.qk_eps), _rms(k, k_norm, spec.qk_eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [A, H(_kv), 1, D]
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    k_S[slot_A, :, pos_A] = k[:, :, 0]
    v_S[slot_A, :, pos_A] = v[:, :, 0]
    if prefix:
        keys, values = k_S[:A, :, :top], v_S[:A, :, :top]
    else:
        keys = k_S.index_select(0, slot_A)[:, :, :top]
        values = v_S.index_select(0, slot_A)[:, :, :top]
    K = spec.kv_heads
    q_A_K_G_D = q.reshape(A, K, spec.heads // K, D)
    scores = torch.matmul(q_A_K_G_D, keys.transpose(2, 3)).float() * spec.scaling + bias_A_1_1_C
    weights = torch.softmax(scores, dim=-1).to(values.dtype)
    out = torch.matmul(weights, values).reshape(A, 1, spec.heads * D)
    h = h + _project(out, *o_p)
    x = _rms(h, norm2, spec.norm_eps[1])
    return h + _project(functional.silu(_project(x, *gate_p)) * _project(x, *up_p), *down_p)


def _project(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    adapter: tuple[torch.Tensor, torch.Tensor, float] | None,
) -> torch.Tensor:
    """A linear projection with PEFT's LoRA arithmetic: the adapter in its own dtype, the sum
    cast back to the base result's dtype."""
    y = functional.linear(x, weight, bias)
    if adapter is None:
        return y
    lora_a, lora_b, scaling = adapter
    delta = functional.linear(functional.linear(x.to(lora_a.dtype), lora_a), lora_b)
    return (y + delta * scaling).to(y.dtype)


def _norm_of(module: nn.Module | None) -> tuple[torch.Tensor, float] | None:
    if module is None or type(module).__name__ not in _RMS_NORMS:
        return None
    weight, eps = getattr(module, "weight", None), getattr(module, "variance_epsilon", None)
    if not isinstance(weight, torch.Tensor) or not isinstance(eps, float):
        return None
    return weight, eps


def _linear(module: object) -> tuple[list[torch.Tensor], bool] | None:
    """A plain linear layer's weight and bias (if any), and whether it has a bias."""
    if not isinstance(module, nn.Linear):
        return None
    bias: object = getattr(module, "bias", None)
    if isinstance(bias, torch.Tensor):
        return [module.weight, bias], True
    return [module.weight], False


def _projection_of(module: nn.Module) -> tuple[list[torch.Tensor], bool, float | None] | None:
    """A projection's tensors (weight, bias?, lora_A?, lora_B?), whether it has a bias, and its
    adapter's scaling; None for a module of another kind."""
    plain = _linear(module)
    if plain is not None:
        return plain[0], plain[1], None
    base = _linear(getattr(module, "base_layer", None))
    if base is None or module.training or getattr(module, "merged", True):
        return None
    if getattr(module, "disable_adapters", True) or getattr(module, "lora_variant", None):
        return None
    active = cast(Any, getattr(module, "active_adapters", []))
    lora_a = cast(Any, getattr(module, "lora_A", {}))
    lora_b = cast(Any, getattr(module, "lora_B", {}))
    present = [name for name in active if name in lora_a]
    if not present:
        return base[0], base[1], None
    a, b = _linear(lora_a[present[0]]), _linear(lora_b[present[0]])
    if len(present) > 1 or a is None or b is None or a[1] or b[1]:
        return None  # several adapters at once, or an adapter with a bias
    scaling = cast(Any, getattr(module, "scaling", {})).get(present[0])
    if not isinstance(scaling, (int, float)):
        return None
    return [*base[0], a[0][0], b[0][0]], base[1], float(scaling)


def layer_tensors(
    layer: Any, *, heads: int, kv_heads: int, head_dim: int, hidden_act: str
) -> tuple[_Spec, tuple[torch.Tensor, ...]] | None:
    """A decoder layer's spec and flat tensors for :func:`_layer`, read from its modules (a
    :class:`tempering.local.fastdecode._Layer`); None where a module is of another kind."""
    if hidden_act != "silu":
        return None
    norms = [_norm_of(layer.input_norm), _norm_of(layer.post_norm)]
    qk = [_norm_of(layer.q_norm), _norm_of(layer.k_norm)] if layer.q_norm is not None else []
    mlp = layer.mlp
    modules = [layer.q, layer.k, layer.v, layer.o]
    modules += [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if any(n is None for n in norms + qk) or any(not isinstance(m, nn.Module) for m in modules):
        return None
    if type(mlp).__name__ not in {"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP"}:
        return None
    read = [_projection_of(cast(nn.Module, m)) for m in modules]
    if any(r is None for r in read):
        return None
    projections = [r for r in read if r is not None]
    normed = [n for n in norms + qk if n is not None]
    qk_eps = normed[2][1] if qk else None
    tensors: list[torch.Tensor] = [n[0] for n in normed]
    for t, _, _ in projections:
        tensors += t
    spec = _Spec(
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        norm_eps=(normed[0][1], normed[1][1]),
        qk_eps=qk_eps,
        scaling=float(layer.scaling),
        bias=tuple(b for _, b, _ in projections),
        lora=tuple(s for _, _, s in projections),
    )
    return spec, tuple(tensors)


RECOMPILE_LIMIT = 64
"""torch's limit on compilations per function is raised to at least this: every variant (model
structure, gathered or prefix slots, attention over the whole cache or a part) is one
compilation of the same function."""


@functools.cache
def _compiled(spec: _Spec, prefix: bool) -> Callable[..., torch.Tensor]:
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)

    def step(*args: Any) -> torch.Tensor:
        return _layer(spec, prefix, *args)

    return cast(Callable[..., torch.Tensor], torch.compile(step, dynamic=True))


class CompiledLayers:
    """The compiled decode step of every layer of one model (see the module docs)."""

    def __init__(self, specs: list[tuple[_Spec, tuple[torch.Tensor, ...]]]) -> None:
        self.layers = specs

    @staticmethod
    def of(
        layers: list[Any],
        model: nn.Module,
        device: torch.device,
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        hidden_act: str,
    ) -> CompiledLayers | None:
        """The compiled layers of ``model`` (the decoder's shape as the static decoder reads
        it), or None where compiling is not wanted or a layer is of another kind."""
        if not compile_wanted(model, device):
            return None
        read = [
            layer_tensors(layer, heads=heads, kv_heads=kv_heads, head_dim=head_dim, hidden_act=hidden_act)
            for layer in layers
        ]
        if any(r is None for r in read):
            return None
        return CompiledLayers([r for r in read if r is not None])

    def __call__(self, i: int, prefix: bool, *inputs: torch.Tensor | int) -> torch.Tensor | None:
        """Layer ``i``'s step on ``inputs`` (:func:`_layer`'s, from ``h`` to ``top``), or None
        if compilation failed (the caller runs the module path; nothing was written)."""
        if _failed:
            return None
        spec, tensors = self.layers[i]
        try:
            # Without duck shaping, sizes that happen to be equal on the first call (rows and
            # slots, say) keep separate symbols, so they may differ later without a recompile.
            with cast(Any, fx_config).patch(use_duck_shape=False):
                return _compiled(spec, prefix)(*inputs, tensors)
        except Exception as exc:  # compilation (a missing compiler, an unsupported op): decode uncompiled
            if not _is_compile_error(exc):
                raise
            _failed.append(f"{type(exc).__name__}: {exc}")
            warnings.warn(
                f"compiling the decode step failed ({_failed[0].splitlines()[0][:300]}); decoding "
                f"without compiling in this process (set {COMPILE_ENV}=0 to skip the attempt)",
                RuntimeWarning,
                stacklevel=2,
            )
            return None


def _is_compile_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from torch's compiler stack (dynamo, inductor, the C++ build)."""
    module = type(exc).__module__ or ""
    return module.startswith(("torch._dynamo", "torch._inductor", "torch._subclasses")) or isinstance(
        exc, (OSError, ImportError, NotImplementedError)
    )
