"""Renderers: chat messages <-> tokens for each chat format.

Every renderer implements :class:`tempering_protocols.Renderer` and takes a tokenizer (any
Hugging Face tokenizer); it looks up the special tokens of its format in it and raises
:class:`MissingSpecialTokenError` naming one that is missing.

The registry holds every text renderer of the Tinker Cookbook 0.6.1's ``get_renderer`` under
its name, token-identical to it (``role_colon``, ``llama3``, ``qwen3*``, ``qwen3_5*``,
``qwen3_8_*``, ``deepseekv3*``, ``deepseekv4_1*``, ``gpt_oss_*``, ``kimi_k2*``,
``nemotron3*``, ``glm5_3_*``), plus tempering's ``chatml`` (plain ChatML, for the local tiny
model), ``smollm2`` (ChatML with SmolLM2's default system prompt, for the local engine's real
model) and ``hf_template`` (any tokenizer's own chat template). Each family lives in its own
module and is imported on first use. :data:`LEFT_OUT` names the cookbook renderers that are
refused, and why. The table of formats is docs/renderers.md.

Example::

    from tempering.renderers import get_renderer, render_supervised_batch
    renderer = get_renderer("qwen3", tokenizer)
    examples = await render_supervised_batch(renderer, conversations, "all_assistant_messages")
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import cast

from tempering.renderers._base import (
    BaseRenderer,
    MessageParts,
    MissingSpecialTokenError,
    NoTrainableTokensError,
    ParseTermination,
    Piece,
    Rendering,
    describe_conversation,
    encode_batch,
    message_weights,
)
from tempering.renderers._batch import render_supervised_batch, render_supervised_batch_sync
from tempering.renderers.chatml import (
    ChatMLRenderer,
    Qwen3DisableThinkingRenderer,
    Qwen3InstructRenderer,
    Qwen3Renderer,
)
from tempering.renderers.hf_template import HFTemplateRenderer, TemplateNotPrefixStableError
from tempering.renderers.llama3 import Llama3Renderer
from tempering.renderers.role_colon import RoleColonRenderer
from tempering_protocols import Tokenizer

__all__ = [
    "LEFT_OUT",
    "RENDERERS",
    "BaseRenderer",
    "ChatMLRenderer",
    "HFTemplateRenderer",
    "Llama3Renderer",
    "MessageParts",
    "MissingSpecialTokenError",
    "NoTrainableTokensError",
    "ParseTermination",
    "Piece",
    "Qwen3DisableThinkingRenderer",
    "Qwen3InstructRenderer",
    "Qwen3Renderer",
    "Rendering",
    "RoleColonRenderer",
    "TemplateNotPrefixStableError",
    "describe_conversation",
    "encode_batch",
    "get_renderer",
    "message_weights",
    "render_supervised_batch",
    "render_supervised_batch_sync",
]

_FAMILY_MODULES: dict[str, tuple[str, ...]] = {
    "role_colon": ("role_colon",),
    "llama3": ("llama3",),
    "chatml": ("chatml", "qwen3", "qwen3_disable_thinking", "qwen3_instruct"),
    "hf_template": ("hf_template",),
    "smollm2": ("smollm2",),
    "qwen3_5": (
        "qwen3_5",
        "qwen3_5_disable_thinking",
        "qwen3_5_preserve_thinking",
        "qwen3_8_xhigh_reasoning",
        "qwen3_8_medium_reasoning",
        "qwen3_8_low_reasoning",
        "qwen3_8_disable_thinking",
    ),
    "deepseek": (
        "deepseekv3",
        "deepseekv3_disable_thinking",
        "deepseekv3_thinking",
        "deepseekv4_1",
        "deepseekv4_1_low_reasoning",
        "deepseekv4_1_max_reasoning",
        "deepseekv4_1_disable_thinking",
        "deepseekv4_1_preserve_thinking",
    ),
    "gpt_oss": (
        "gpt_oss_no_sysprompt",
        "gpt_oss_low_reasoning",
        "gpt_oss_medium_reasoning",
        "gpt_oss_high_reasoning",
    ),
    "kimi": (
        "kimi_k2",
        "kimi_k25",
        "kimi_k25_disable_thinking",
        "kimi_k26",
        "kimi_k26_disable_thinking",
        "kimi_k26_preserve_thinking",
    ),
    "nemotron": (
        "nemotron3",
        "nemotron3_disable_thinking",
        "nemotron3_low_thinking",
        "nemotron3_preserve_thinking",
        "nemotron3_ultra",
        "nemotron3_ultra_disable_thinking",
        "nemotron3_ultra_medium_thinking",
        "nemotron3_ultra_preserve_thinking",
    ),
    "glm": ("glm5_3_max_reasoning", "glm5_3_low_reasoning", "glm5_3_high_reasoning"),
}
"""Which module of this package defines each registry name (in its own ``RENDERERS`` dict)."""

LEFT_OUT: dict[str, str] = {
    **dict.fromkeys(
        ("qwen3_vl", "qwen3_vl_instruct"),
        "vision-language renderers need an image processor and image chunks, which tempering's "
        "text renderers do not produce; use qwen3 / qwen3_instruct for text-only conversations",
    ),
    **dict.fromkeys(
        (
            "kimi_k31_pro_max_reasoning",
            "kimi_k31_pro_high_reasoning",
            "kimi_k31_pro_low_reasoning",
            "kimi_k31_pro_disable_thinking",
            "kimi_k31_pro_no_reasoning_effort",
            "tml_v0",
        ),
        "the Tinker Cookbook delegates this format to the tml-renderers package, whose format is "
        "not published in a version tempering can check against; render it with the cookbook",
    ),
}
"""Names the Tinker Cookbook registers that tempering refuses, and why."""


class _Registry(Mapping[str, Callable[[Tokenizer], BaseRenderer]]):
    """Renderer constructors by registry name; each family's module is imported on first use."""

    def __init__(self) -> None:
        self._module_of = {name: mod for mod, names in _FAMILY_MODULES.items() for name in names}

    def __getitem__(self, name: str) -> Callable[[Tokenizer], BaseRenderer]:
        module = importlib.import_module(f"{__name__}.{self._module_of[name]}")
        table = cast("Mapping[str, Callable[[Tokenizer], BaseRenderer]]", module.RENDERERS)
        return table[name]

    def __contains__(self, name: object) -> bool:
        return name in self._module_of

    def __iter__(self) -> Iterator[str]:
        return iter(self._module_of)

    def __len__(self) -> int:
        return len(self._module_of)


RENDERERS: Mapping[str, Callable[[Tokenizer], BaseRenderer]] = _Registry()
"""Renderer constructors by registry name (the Tinker Cookbook's names, plus ``chatml`` and
``hf_template``)."""


def get_renderer(name: str, tokenizer: Tokenizer) -> BaseRenderer:
    """The renderer registered as ``name``, for ``tokenizer``.

    Example::

        renderer = get_renderer("llama3", tokenizer)
        renderer.get_stop_sequences()  # [<id of <|eot_id|>>]
    """
    if name in LEFT_OUT:
        raise ValueError(f"renderer {name!r} is not available in tempering: {LEFT_OUT[name]}")
    if name not in RENDERERS:
        raise ValueError(f"unknown renderer {name!r}; known: {', '.join(RENDERERS)}")
    return RENDERERS[name](tokenizer)
