"""tempering's renderers pass the protocol conformance kit."""

from __future__ import annotations

from tempering.renderers import BaseRenderer
from tempering_protocols.testing import check_renderer


def test_conformance_kit(renderer: BaseRenderer) -> None:
    check_renderer(renderer)


def test_conformance_kit_with_tool_calls(renderers: dict[str, BaseRenderer]) -> None:
    for name in ("chatml", "qwen3", "qwen3_disable_thinking"):
        check_renderer(
            renderers[name],
            messages=[
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [{"name": "weather", "arguments": "{}"}]},
                {"role": "tool", "content": "sunny"},
                {"role": "assistant", "content": "Sunny."},
            ],
        )
