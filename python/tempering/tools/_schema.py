"""JSON schemas of Python callables, from their signature and docstring.

A parameter's JSON type comes from its annotation (``str``, ``int``, ``float``, ``bool``,
``list[X]``, ``dict[str, X]``, ``Literal[...]``, ``X | None``); its description from the
docstring's ``Args:`` section (Google style: ``name: text``, continuation lines indented) or
``:param name: text`` lines. A parameter without a default is required. The docstring's first
paragraph is the tool's description.

Example::

    def add(a: int, b: int = 0) -> str:
        '''Add two integers.

        Args:
            a: the first addend
            b: the second addend
        '''
    function_schema(add)
    # ("Add two integers.", {"type": "object", "properties": {"a": {"type": "integer",
    #   "description": "the first addend"}, ...}, "required": ["a"], "additionalProperties": False})
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, cast

__all__ = ["check_arguments", "function_schema", "json_type"]

_SCALARS: dict[type, str] = {str: "string", bool: "boolean", int: "integer", float: "number"}


def json_type(annotation: object, where: str) -> dict[str, object]:
    """The JSON schema of one annotation; ``TypeError`` naming ``where`` for one it cannot map."""
    if isinstance(annotation, type) and annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        values = list(args)
        kinds = {type(v) for v in values}
        if len(kinds) == 1 and next(iter(kinds)) in _SCALARS:
            return {"type": _SCALARS[next(iter(kinds))], "enum": values}
        return {"enum": values}
    if origin in (list, tuple, typing.Sequence) or annotation is list or annotation is tuple:
        item = args[0] if args else None
        return {"type": "array"} if item is None else {"type": "array", "items": json_type(item, where)}
    if origin in (dict, typing.Mapping) or annotation is dict:
        if len(args) == 2:
            return {"type": "object", "additionalProperties": json_type(args[1], where)}
        return {"type": "object"}
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return json_type(rest[0], where)
        return {"anyOf": [json_type(a, where) for a in rest]}
    raise TypeError(
        f"{where}: annotation {annotation!r} has no JSON-schema equivalent; use str, int, float, "
        "bool, list[...], dict[str, ...], Literal[...] or X | None"
    )


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph of ``doc`` and the description of each documented parameter."""
    doc = inspect.cleandoc(doc)
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    for name, text in re.findall(r"^\s*:param\s+(\w+):\s*(.+)$", doc, flags=re.MULTILINE):
        params[name] = text.strip()
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?|\s*\n)+)", doc, re.MULTILINE)
    if section:
        current: str | None = None
        for line in section.group(1).splitlines():
            entry = re.match(r"^\s{0,8}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
            if entry and (current is None or len(line) - len(line.lstrip()) <= 8):
                key = entry.group(1)
                params[key] = entry.group(2).strip()
                current = key
            elif current is not None and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
    return description, params


def function_schema(fn: Callable[..., object], name: str) -> tuple[str, dict[str, object]]:
    """``(description, parameters)`` of ``fn``: the docstring's first paragraph and an
    object schema of its parameters (``*args``/``**kwargs`` are refused)."""
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except NameError as exc:
        raise TypeError(f"tool {name!r}: cannot resolve its annotations ({exc})") from None
    description, docs = _docstring_parts(fn.__doc__ or "")
    properties: dict[str, object] = {}
    required: list[str] = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *{param.name} / **{param.name} have no JSON schema")
        if param.name not in hints:
            raise TypeError(f"tool {name!r}: parameter {param.name!r} has no type annotation")
        schema = json_type(hints[param.name], f"tool {name!r}, parameter {param.name!r}")
        if param.name in docs:
            schema["description"] = docs[param.name]
        properties[param.name] = schema
        if param.default is param.empty:
            required.append(param.name)
    parameters: dict[str, object] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return description or name, parameters


def _matches(value: object, schema: Mapping[str, Any]) -> bool:
    if "enum" in schema:
        return value in schema["enum"]
    if "anyOf" in schema:
        return any(_matches(value, s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "array":
        items = schema.get("items")
        return isinstance(value, list) and (
            items is None or all(_matches(v, items) for v in cast(list[object], value))
        )
    if kind == "object":
        return isinstance(value, dict)
    return True


def check_arguments(arguments: Mapping[str, object], parameters: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the object schema ``parameters`` (``None`` when they do):
    a missing required argument, an unknown one, or a value of the wrong JSON type."""
    properties: Mapping[str, Any] = parameters.get("properties", {})
    missing = [p for p in parameters.get("required", []) if p not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    unknown = [a for a in arguments if a not in properties]
    if unknown:
        return f"unknown argument(s): {', '.join(unknown)}; expected: {', '.join(properties) or 'none'}"
    for key, value in arguments.items():
        if not _matches(value, properties[key]):
            want = properties[key].get("type") or properties[key].get("enum") or properties[key]
            return f"argument {key!r} should be {want}, got {type(value).__name__} {value!r:.60}"
    return None
