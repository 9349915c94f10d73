"""Renderers: chat messages <-> tokens for each chat format.

Every renderer implements :class:`tempering_protocols.Renderer` and takes a tokenizer (any
Hugging Face tokenizer); it looks up the special tokens of its format in it and raises
:class:`MissingSpecialTokenError` naming one that is missing.

| name | format | extends prefixes |
| --- | --- | --- |
| ``role_colon`` | ``User: …\\n\\nAssistant: …`` (no special tokens) | yes |
| ``chatml`` | ``<|im_start|>role\\n…<|im_end|>`` | yes |
| ``qwen3`` | ChatML with ``<think>`` blocks, stripped from history | no |
| ``qwen3_disable_thinking`` | ChatML with an empty ``<think>`` block in every assistant header | yes |
| ``llama3`` | ``<|start_header_id|>role<|end_header_id|>\\n\\n…<|eot_id|>`` | yes |
| ``hf_template`` | the tokenizer's own chat template | yes (others rejected) |

Example::

    from tempering.renderers import get_renderer, render_supervised_batch
    renderer = get_renderer("qwen3", tokenizer)
    examples = await render_supervised_batch(renderer, conversations, "all_assistant_messages")
"""

from __future__ import annotations

from collections.abc import Callable

from tempering.renderers._base import (
    BaseRenderer,
    MessageParts,
    MissingSpecialTokenError,
    NoTrainableTokensError,
    Piece,
    Rendering,
    describe_conversation,
    encode_batch,
    message_weights,
)
from tempering.renderers._batch import render_supervised_batch, render_supervised_batch_sync
from tempering.renderers.chatml import ChatMLRenderer, Qwen3DisableThinkingRenderer, Qwen3Renderer
from tempering.renderers.hf_template import HFTemplateRenderer, TemplateNotPrefixStableError
from tempering.renderers.llama3 import Llama3Renderer
from tempering.renderers.role_colon import RoleColonRenderer
from tempering_protocols import Tokenizer

__all__ = [
    "RENDERERS",
    "BaseRenderer",
    "ChatMLRenderer",
    "HFTemplateRenderer",
    "Llama3Renderer",
    "MessageParts",
    "MissingSpecialTokenError",
    "NoTrainableTokensError",
    "Piece",
    "Qwen3DisableThinkingRenderer",
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

RENDERERS: dict[str, Callable[[Tokenizer], BaseRenderer]] = {
    "role_colon": RoleColonRenderer,
    "chatml": ChatMLRenderer,
    "qwen3": Qwen3Renderer,
    "qwen3_disable_thinking": Qwen3DisableThinkingRenderer,
    "llama3": Llama3Renderer,
    "hf_template": HFTemplateRenderer,
}
"""Renderer constructors by registry name."""


def get_renderer(name: str, tokenizer: Tokenizer) -> BaseRenderer:
    """The renderer registered as ``name``, for ``tokenizer``.

    Example::

        renderer = get_renderer("llama3", tokenizer)
        renderer.get_stop_sequences()  # [<id of <|eot_id|>>]
    """
    try:
        make = RENDERERS[name]
    except KeyError:
        raise ValueError(f"unknown renderer {name!r}; known: {', '.join(RENDERERS)}") from None
    return make(tokenizer)
