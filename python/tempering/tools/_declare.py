"""How a tool list reaches the model: the renderer's own tool-declaration format, or a plain one.

Every renderer with a tool format (Qwen3, DeepSeek, Kimi, GLM, gpt-oss, Nemotron, ...)
implements ``create_conversation_prefix_with_tools``; :func:`tool_prefix` uses it. A renderer
without one (``chatml``, which the tiny model uses, ``role_colon``, ``llama3``) raises
``NotImplementedError``; then the tools are declared in one system message, compactly (one
``name(arg: type, ...): description`` line per tool), with the ``<tool_call>`` JSON block that
ChatML's parser reads.

Example::

    prefix = tool_prefix(renderer, [calculator, search], "Answer with a number.")
    prompt = renderer.build_generation_prompt([*prefix, {"role": "user", "content": "2+3?"}])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from tempering.tools._tool import Tool
from tempering_protocols import Message

__all__ = ["plain_tool_declaration", "tool_prefix"]

PLAIN_TOOL_CALL = '<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>'


def _signature(tool: Tool) -> str:
    props: Mapping[str, Mapping[str, Any]] = tool.parameters.get("properties", {})
    args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
    return f"{tool.name}({args}): {tool.description}"


def plain_tool_declaration(tools: Sequence[Tool], system_prompt: str = "") -> str:
    """The system text that declares ``tools`` for a renderer with no tool format of its own."""
    lines = [
        "Tools:",
        *(_signature(t) for t in tools),
        f"To call a tool, write {PLAIN_TOOL_CALL}",
    ]
    text = "\n".join(lines)
    return f"{system_prompt}\n\n{text}" if system_prompt else text


def tool_prefix(renderer: object, tools: Sequence[Tool], system_prompt: str = "") -> list[Message]:
    """Messages that declare ``tools`` to put before the conversation: the renderer's own format
    when it has one, else one system message (:func:`plain_tool_declaration`)."""
    create = cast(
        "Callable[[Sequence[Mapping[str, object]], str], list[Message]] | None",
        getattr(renderer, "create_conversation_prefix_with_tools", None),
    )
    if create is not None:
        try:
            return list(create([t.spec() for t in tools], system_prompt))
        except NotImplementedError:
            pass
    return [Message(role="system", content=plain_tool_declaration(tools, system_prompt))]
