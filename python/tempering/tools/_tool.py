"""Tools: typed Python callables with a JSON schema, and running the calls a model makes.

A :class:`Tool` wraps a sync or async function; its schema (``spec()``) comes from the
function's signature and docstring (:func:`tempering.tools.function_schema`). :func:`run_tool_call`
runs one call the renderer parsed (``{"name", "arguments"}``, arguments as JSON text) and never
raises for what the model or the tool did wrong: an unknown tool, arguments that are not a JSON
object or do not fit the schema, a tool that raises, one that runs past its timeout, one that
returns something other than ``str`` all come back as a :class:`ToolOutcome` whose ``text`` is
the error for the model to read and whose ``status`` says what happened. A result longer than
``max_result_chars`` is cut, with a note saying how much was cut.

A sync tool runs in a daemon thread of its own, so a tool that hangs costs its timeout and a
thread, never the event loop or the process's exit; an async tool is cancelled at its timeout.

Example::

    @tool
    def add(a: int, b: int) -> str:
        '''Add two integers.'''
        return str(a + b)

    outcome = await run_tool_call({"add": add}, {"name": "add", "arguments": '{"a": 2, "b": 3}'})
    outcome.text, outcome.status      # "5", "ok"
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, cast, overload

import attrs

from tempering.tools._schema import check_arguments, function_schema

__all__ = ["Tool", "ToolOutcome", "ToolStatus", "run_tool_call", "tool"]

ToolStatus = Literal["ok", "error", "timeout", "not_text", "bad_arguments", "unknown_tool"]
"""What became of one call: ``ok``, the tool raised (``error``), ran past its timeout
(``timeout``), returned something other than ``str`` (``not_text``), was called with arguments
that do not fit its schema (``bad_arguments``), or does not exist (``unknown_tool``)."""


@attrs.frozen
class Tool:
    """A callable the model may call: ``name``, ``description`` and JSON-schema ``parameters``
    (an object schema), and the function itself. ``timeout_s``: this tool's own time limit
    (``None``: the caller's).

    Example::

        Tool.from_function(search, timeout_s=5.0).spec()
        # {"name": "search", "description": "...", "parameters": {...}}
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., object] = attrs.field(eq=False, repr=False)
    timeout_s: float | None = None

    @classmethod
    def from_function(
        cls, fn: Callable[..., object], *, name: str | None = None, timeout_s: float | None = None
    ) -> Tool:
        """The tool of ``fn``, its schema derived from the signature and docstring."""
        tool_name = name or getattr(fn, "__name__", "")
        if not tool_name.isidentifier():
            raise ValueError(f"tool name {tool_name!r} must be an identifier (letters, digits, _)")
        description, parameters = function_schema(fn, tool_name)
        return cls(tool_name, description, parameters, fn, timeout_s)

    def spec(self) -> dict[str, object]:
        """``{"name", "description", "parameters"}``: what renderers declare to the model."""
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


@overload
def tool(fn: Callable[..., object], /) -> Tool: ...


@overload
def tool(
    *, name: str | None = None, timeout_s: float | None = None
) -> Callable[[Callable[..., object]], Tool]: ...


def tool(
    fn: Callable[..., object] | None = None, /, *, name: str | None = None, timeout_s: float | None = None
) -> Tool | Callable[[Callable[..., object]], Tool]:
    """Decorator: the function as a :class:`Tool` (``@tool`` or ``@tool(name=..., timeout_s=...)``)."""
    if fn is not None:
        return Tool.from_function(fn, name=name, timeout_s=timeout_s)
    return lambda f: Tool.from_function(f, name=name, timeout_s=timeout_s)


@attrs.frozen
class ToolOutcome:
    """One call's result: ``text`` (the tool's result, or the error, for the model), ``status``,
    the tool's ``name`` as the model wrote it, and whether ``text`` was ``truncated``."""

    name: str
    text: str
    status: ToolStatus
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _run_in_thread(fn: Callable[..., object], kwargs: Mapping[str, object]) -> asyncio.Future[object]:
    """Run a sync ``fn`` in a daemon thread; its result (or exception) resolves the future."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[object] = loop.create_future()

    def settle(ok: bool, value: object) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(cast(BaseException, value))

    def target() -> None:
        try:
            result = fn(**kwargs)
        except BaseException as exc:
            try:
                loop.call_soon_threadsafe(settle, False, exc)
            except RuntimeError:  # the loop closed while the tool ran
                return
            return
        try:
            loop.call_soon_threadsafe(settle, True, result)
        except RuntimeError:
            return

    threading.Thread(target=target, daemon=True, name="tempering-tool").start()
    return future


def _cap(text: str, max_chars: int | None) -> tuple[str, bool]:
    if max_chars is None or len(text) <= max_chars:
        return text, False
    cut = len(text) - max_chars
    return f"{text[:max_chars]}\n[truncated: {cut} more characters]", True


def _arguments(raw: object) -> dict[str, object] | str:
    """The call's arguments as a dict, or why they are not a JSON object."""
    if isinstance(raw, Mapping):
        return dict(cast(Mapping[str, object], raw))
    if not isinstance(raw, str):
        return f"arguments must be a JSON object, got {type(raw).__name__}"
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        return f"arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(value, dict):
        return f"arguments must be a JSON object, got {type(value).__name__}"
    return cast(dict[str, object], value)


async def run_tool_call(
    tools: Mapping[str, Tool],
    call: Mapping[str, object],
    *,
    timeout_s: float = 30.0,
    max_result_chars: int | None = 4000,
) -> ToolOutcome:
    """Run one parsed tool call against ``tools`` (name → tool); see the module docstring.

    ``timeout_s`` applies unless the tool has its own; ``max_result_chars`` caps the text the
    model gets back (errors included; ``None``: no cap).
    """
    name = str(call.get("name", ""))
    found = tools.get(name)
    if found is None:
        known = ", ".join(sorted(tools)) or "none"
        return ToolOutcome(name, f"Error: no tool named {name!r}; tools: {known}", "unknown_tool")
    arguments = _arguments(call.get("arguments", "{}"))
    problem = arguments if isinstance(arguments, str) else check_arguments(arguments, found.parameters)
    if problem is not None or isinstance(arguments, str):
        return ToolOutcome(name, f"Error: bad arguments for {name}: {problem}", "bad_arguments")
    limit = found.timeout_s if found.timeout_s is not None else timeout_s
    try:
        async with asyncio.timeout(limit):
            if found.is_async:
                result = await cast(Callable[..., Awaitable[object]], found.fn)(**arguments)
            else:
                result = await _run_in_thread(found.fn, arguments)
    except TimeoutError:
        return ToolOutcome(name, f"Error: {name} timed out after {limit:g} s", "timeout")
    except Exception as exc:
        text, cut = _cap(f"Error: {name} raised {type(exc).__name__}: {exc}", max_result_chars)
        return ToolOutcome(name, text, "error", cut)
    if not isinstance(result, str):
        return ToolOutcome(
            name, f"Error: {name} returned {type(result).__name__}, not text (a tool must return str)",
            "not_text",
        )  # fmt: skip
    text, cut = _cap(result, max_result_chars)
    return ToolOutcome(name, text, "ok", cut)
