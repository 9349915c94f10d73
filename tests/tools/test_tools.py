"""Tools: schemas from signatures and docstrings, running calls (faults included), declaring
tools in the renderer's format, the calculator and BM25 search."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import pytest

from tempering.local.tiny import build_tiny_tokenizer
from tempering.renderers import get_renderer
from tempering.tools import Tool, plain_tool_declaration, run_tool_call, tool, tool_prefix
from tempering.tools.calculator import calculator, evaluate_expression
from tempering.tools.search import BM25Search, load_corpus
from tempering_protocols import Message


def weather(city: str, days: int = 1, unit: Literal["C", "F"] = "C", hourly: bool | None = None) -> str:
    """Forecast the weather.

    More text that is not the description.

    Args:
        city: the city's name,
            in English
        days: how many days ahead
    """
    return f"{city}: sunny for {days} days ({unit}, {hourly})"


def test_schema_comes_from_the_signature_and_docstring() -> None:
    spec = Tool.from_function(weather).spec()
    assert spec["name"] == "weather"
    assert spec["description"] == "Forecast the weather."
    params = spec["parameters"]
    assert isinstance(params, dict)
    assert params["required"] == ["city"]
    assert params["properties"] == {
        "city": {"type": "string", "description": "the city's name, in English"},
        "days": {"type": "integer", "description": "how many days ahead"},
        "unit": {"type": "string", "enum": ["C", "F"]},
        "hourly": {"type": "boolean"},
    }


def test_sphinx_params_lists_and_a_bad_annotation() -> None:
    def f(xs: list[float], m: dict[str, int]) -> str:
        """Sum.

        :param xs: numbers
        """
        return ""

    props = Tool.from_function(f).spec()["parameters"]["properties"]  # type: ignore[index]
    assert props == {
        "xs": {"type": "array", "items": {"type": "number"}, "description": "numbers"},
        "m": {"type": "object", "additionalProperties": {"type": "integer"}},
    }

    def g(x: complex) -> str:
        return ""

    with pytest.raises(TypeError, match=r"parameter .x..*no JSON-schema"):
        Tool.from_function(g)

    def h(x) -> str:  # type: ignore[no-untyped-def]
        return ""

    with pytest.raises(TypeError, match="no type annotation"):
        Tool.from_function(h)  # pyright: ignore[reportUnknownArgumentType]


def _run(
    tools: Sequence[Tool], name: str, arguments: object, **kwargs: float | int | None
) -> tuple[str, str, bool]:
    call = {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}
    outcome = asyncio.run(run_tool_call({t.name: t for t in tools}, call, **kwargs))  # type: ignore[arg-type]
    return outcome.text, outcome.status, outcome.truncated


def test_a_good_call_and_bad_arguments() -> None:
    w = Tool.from_function(weather)
    assert _run([w], "weather", {"city": "Oslo", "days": 2}) == (
        "Oslo: sunny for 2 days (C, None)",
        "ok",
        False,
    )
    text, status, _ = _run([w], "weather", {"days": 2})
    assert (status, text) == (
        "bad_arguments",
        "Error: bad arguments for weather: missing required argument(s): city",
    )
    assert _run([w], "weather", {"city": "Oslo", "day": 1})[1] == "bad_arguments"
    assert "should be integer" in _run([w], "weather", {"city": "Oslo", "days": "2"})[0]
    assert "not valid JSON" in _run([w], "weather", "{city: Oslo")[0]
    assert "JSON object" in _run([w], "weather", "[1, 2]")[0]
    assert _run([w], "weather", {"city": "Oslo", "unit": "K"})[1] == "bad_arguments"
    text, status, _ = _run([w], "forecast", {})
    assert status == "unknown_tool"
    assert "tools: weather" in text


@tool
def explode(x: int) -> str:
    """Always fails."""
    raise RuntimeError(f"boom {x}")


@tool(timeout_s=0.2)
def hang(x: int) -> str:
    """Never returns in time (a sync tool)."""
    time.sleep(30)
    return "late"


@tool
async def hang_async(x: int) -> str:
    """Never returns (an async tool)."""
    await asyncio.sleep(3600)
    return "never"


@tool
def not_text(x: int) -> str:
    """Returns a dict despite its annotation."""
    return {"x": x}  # type: ignore[return-value]


@tool
async def big(n: int) -> str:
    """A long result."""
    return "y" * n


@pytest.mark.timeout(20)
def test_faulty_tools_come_back_as_error_text() -> None:
    tools = [explode, hang, hang_async, not_text, big]
    assert _run(tools, "explode", {"x": 3}) == ("Error: explode raised RuntimeError: boom 3", "error", False)
    start = time.monotonic()
    text, status, _ = _run(tools, "hang", {"x": 1})  # its own 0.2 s timeout
    assert (status, text) == ("timeout", "Error: hang timed out after 0.2 s")
    assert time.monotonic() - start < 10
    assert _run(tools, "hang_async", {"x": 1}, timeout_s=0.1)[1] == "timeout"
    text, status, _ = _run(tools, "not_text", {"x": 1})
    assert status == "not_text"
    assert "returned dict, not text" in text
    text, status, cut = _run(tools, "big", {"n": 50}, max_result_chars=10)
    assert (status, cut) == ("ok", True)
    assert text == "yyyyyyyyyy\n[truncated: 40 more characters]"
    assert _run(tools, "big", {"n": 10}, max_result_chars=10) == ("y" * 10, "ok", False)


def test_calculator() -> None:
    assert evaluate_expression("12 * (3 + 4)") == "84"
    assert evaluate_expression("7 / 2") == "3.5"
    assert evaluate_expression("-2 ** 3") == "-8"
    for bad, why in [
        ("__import__('os')", "only numbers"),
        ("2 ** 1000", "exponent"),
        ("1 +", "not an arithmetic"),
        ("x" * 300, "at most 200"),
    ]:
        with pytest.raises(ValueError, match=why):
            evaluate_expression(bad)
    assert _run([calculator], "calculator", {"expression": "1/0"})[1] == "error"


def test_bm25_search(tmp_path) -> None:  # type: ignore[no-untyped-def]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "\n".join(
            json.dumps({"text": t})
            for t in [
                "Paris is the capital of France.",
                "The Nile is a long river.",
                "Tokyo has many trains.",
            ]
        )
    )
    index = BM25Search(load_corpus(corpus), top_k=2)
    assert index.search("capital of France").startswith("[1] Paris is the capital of France.")
    assert index.search("river") == "[1] The Nile is a long river."
    assert index.search("the of") == "No results (the query has no searchable words)."
    assert index.search("zebra") == "No results."
    assert _run([index.as_tool()], "search", {"query": "trains"})[0] == "[1] Tokyo has many trains."
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_corpus(bad)


class _Declares:
    def __init__(self) -> None:
        self.seen: list[Mapping[str, object]] = []

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[Mapping[str, object]], system_prompt: str = ""
    ) -> list[Message]:
        self.seen = list(tools)
        return [{"role": "system", "content": f"OWN FORMAT {system_prompt}"}]


def test_tool_prefix_uses_the_renderer_format_else_a_plain_one() -> None:
    own = _Declares()
    assert tool_prefix(own, [calculator], "hi") == [{"role": "system", "content": "OWN FORMAT hi"}]
    assert own.seen == [calculator.spec()]
    chatml = get_renderer("chatml", build_tiny_tokenizer())
    (message,) = tool_prefix(chatml, [calculator], "Be brief.")
    assert message["content"] == plain_tool_declaration([calculator], "Be brief.")
    assert message["content"].startswith("Be brief.\n\nTools:\ncalculator(expression: string): Evaluate")
    assert "<tool_call>" in message["content"]


def test_every_renderer_with_a_tool_format_declares_the_schemas() -> None:
    """Each renderer that has a tool-declaration format gets the tools' specs through it (the
    tool's name and description reach the prompt); the others get the plain declaration."""
    # By path: a top-level ``renderers`` package (verifiers' dependency) shadows tests/renderers.
    tokenizers = sys.modules.get("renderer_tokenizers")
    if tokenizers is None:
        path = Path(__file__).resolve().parents[1] / "renderers" / "renderer_tokenizers.py"
        spec = importlib.util.spec_from_file_location("renderer_tokenizers", path)
        assert spec is not None
        assert spec.loader is not None
        tokenizers = importlib.util.module_from_spec(spec)
        sys.modules["renderer_tokenizers"] = tokenizers
        spec.loader.exec_module(tokenizers)
    tokenizer = tokenizers.make_tokenizer()
    own = 0
    for name in tokenizers.SHARED_TOKENIZER_NAMES:
        renderer = get_renderer(name, tokenizer)
        prefix = tool_prefix(renderer, [calculator], "Be brief.")
        try:
            expected = renderer.create_conversation_prefix_with_tools([calculator.spec()], "Be brief.")
        except NotImplementedError:
            assert prefix == [
                {"role": "system", "content": plain_tool_declaration([calculator], "Be brief.")}
            ]
            continue
        own += 1
        assert prefix == expected, name
        text = json.dumps(prefix)
        assert "calculator" in text
        assert "Evaluate an arithmetic expression" in text, name
        renderer.build_generation_prompt([*prefix, {"role": "user", "content": "2+2?"}])
    assert own >= 3
