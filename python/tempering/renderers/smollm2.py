"""SmolLM2's chat format: ChatML with a default system prompt.

SmolLM2-Instruct's chat template (``HuggingFaceTB/SmolLM2-135M-Instruct``, and the copy in the
GGUF that ``tempering models pull smollm2-135m-instruct`` converts) is plain ChatML, except that
a conversation whose first message is not a system message gets one first::

    <|im_start|>system
    You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
    <|im_start|>user
    What is 2+2?<|im_end|>
    <|im_start|>assistant

This renderer writes exactly that, token for token (tests/renderers/test_smollm2.py compares it
with the model's own ``apply_chat_template``). The default system prompt is the rendering's
prefix: it is not a message, so it has weight 0 under every ``train_on_what`` (``all_tokens``
included, as a BOS token does); a system message given in the conversation replaces it and is
weighted as any message. An empty conversation gets no system prompt (as the template does).

The template knows nothing of thinking or tool calls; a message that has them is rendered as
``chatml`` renders them (``<think>`` and ``<tool_call>`` blocks in the content).

Example::

    r = get_renderer("smollm2", tokenizer)
    r.build_generation_prompt([{"role": "user", "content": "2+2?"}])
    # <|im_start|>system\\nYou are a helpful AI assistant named SmolLM, …<|im_end|>\\n
    # <|im_start|>user\\n2+2?<|im_end|>\\n<|im_start|>assistant\\n
"""

from __future__ import annotations

from collections.abc import Sequence

from tempering.renderers._base import MessageParts, Piece, Rendering
from tempering.renderers.chatml import ChatMLRenderer
from tempering_protocols import Message

__all__ = ["DEFAULT_SYSTEM_PROMPT", "SmolLM2Renderer"]

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""The system prompt SmolLM2's template writes when the conversation has none."""


class SmolLM2Renderer(ChatMLRenderer):
    """ChatML with SmolLM2's default system prompt (see the module docstring); extends prefixes."""

    name = "smollm2"

    def render(self, messages: Sequence[Message], *, generation: bool) -> Rendering:
        default_system = bool(messages) and messages[0]["role"] != "system"
        prefix: tuple[Piece, ...] = ()
        offset = 0
        if default_system:
            # One text run, as the template's string is tokenized between its special tokens.
            text = self.constant(f"system\n{DEFAULT_SYSTEM_PROMPT}")
            prefix = (self._im_start, text, (self._im_end_id,))
            offset = 1
        parts: list[MessageParts] = []
        for i, message in enumerate(messages):
            header = self._header(i + offset, self._header_role(message))
            parts.append(MessageParts(header, (self._body(messages, i), (self._im_end_id,))))
        gen: tuple[Piece, ...] = ()
        if generation:
            gen = self._header(len(messages) + offset, "assistant")
        return Rendering(prefix=prefix, messages=tuple(parts), generation_header=gen)


RENDERERS = {"smollm2": SmolLM2Renderer}
"""This module's registry names (see :data:`tempering.renderers.RENDERERS`)."""
