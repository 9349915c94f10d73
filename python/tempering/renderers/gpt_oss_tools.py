"""gpt-oss's tool declarations: JSON-schema tools written as Harmony's TypeScript-style namespace
(see :func:`harmony_tool_declarations`; :mod:`tempering.renderers.gpt_oss` re-exports it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import cast

__all__ = ["harmony_tool_declarations"]


def _obj(value: object) -> Mapping[str, object]:
    return cast("Mapping[str, object]", value) if isinstance(value, Mapping) else {}


def _list(value: object) -> list[object]:
    return cast("list[object]", value) if isinstance(value, list) else []


def _ts_type(schema: Mapping[str, object]) -> str:
    """A JSON schema as a TypeScript type, the way the Harmony tool declarations write it."""
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " | ".join(_ts_type(_obj(s)) for s in _list(schema[key]))
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " | ".join(_ts_type({"type": t}) for t in cast("list[object]", kind))
    if kind == "string" and "enum" in schema:
        return " | ".join(json.dumps(v) for v in _list(schema["enum"]))
    if kind == "string":
        base = "string"
    elif kind in ("number", "integer"):
        base = "number"
    elif kind == "boolean":
        base = "boolean"
    elif kind == "array":
        base = f"{_ts_type(_obj(schema.get('items', {})))}[]"
    elif kind == "object":
        base = _ts_inline_object(schema)
    else:
        base = "any"
    return f"{base} | null" if schema.get("nullable") else base


def _ts_inline_object(schema: Mapping[str, object]) -> str:
    if schema.get("type") != "object":
        return "any"
    required = set(_list(schema.get("required", [])))
    fields = [
        f"{name}{'' if name in required else '?'}: {_ts_type(_obj(prop))}"
        for name, prop in _obj(schema.get("properties", {})).items()
    ]
    return "{ " + ", ".join(fields) + " }"


def _ts_comments(schema: Mapping[str, object]) -> list[str]:
    out: list[str] = []
    if schema.get("title"):
        out += [str(schema["title"]), ""]
    if schema.get("description"):
        out.append(str(schema["description"]))
    examples = _list(schema.get("examples"))
    if examples:
        out.append("Examples:")
        out += [f"- {json.dumps(e)}" for e in examples]
    return out


def _ts_parameters(schema: Mapping[str, object]) -> str:
    """``(_:\\n{\\nfield: type,\\n})``, one field a line after its comments, or ``()``."""
    properties = _obj(schema.get("properties"))
    if schema.get("type") != "object" or not properties:
        return "()"
    description = schema.get("description")
    lines = ["(_:" + (f" // {description}" if description else ""), "{"]
    required = set(_list(schema.get("required", [])))
    for name, prop in properties.items():
        p = _obj(prop)
        lines += [f"// {c}" for c in _ts_comments(p)]
        default = f" // default: {json.dumps(p['default'])}" if "default" in p else ""
        lines.append(f"{name}{'' if name in required else '?'}: {_ts_type(p)},{default}")
    lines.append("})")
    return "\n".join(lines)


def harmony_tool_declarations(tools: Sequence[Mapping[str, object]]) -> str:
    """The ``# Tools`` section of the developer message: a ``functions`` namespace of
    TypeScript-style signatures, one per ``{"name", "description", "parameters"}`` spec.

    Example::

        harmony_tool_declarations([{"name": "add", "description": "Add.", "parameters": {}}])
        # "# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n// Add.\\ntype add = () => any;…"
    """
    defs: list[str] = []
    for k, tool in enumerate(tools):
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool {k} has no name: {dict(tool)!r:.120}")
        lines = [f"// {tool['description']}"] if tool.get("description") else []
        lines.append(f"type {name} = {_ts_parameters(_obj(tool.get('parameters')))} => any;")
        defs.append("\n".join(lines))
    body = "\n\n".join(defs)
    return f"# Tools\n\n## functions\n\nnamespace functions {{\n\n{body}\n\n}} // namespace functions"
