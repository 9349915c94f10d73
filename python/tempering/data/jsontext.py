"""JSON text with a nesting limit: data rows and request bodies a user or client sends.

Python's ``json`` parser recurses once per level, so a row nested 100,000 levels deep ends in
a ``RecursionError`` with no location. :func:`loads_bounded` refuses text nested deeper than
``max_depth`` with :class:`JSONNestingError` (a ``ValueError``) that gives the depth and the
character where the limit was passed; callers add the file and line, or answer 400.

The check costs one C-level count per text; the exact scan runs only when the text holds more
brackets than the limit.

:func:`loads_object` reads text that must be one JSON object (a config, a record, keyword
arguments) and says why it is not in :class:`NotJSONObjectError`; callers add where the text
came from and what to do.

Example::

    loads_bounded('{"a": [1, 2]}')            # {'a': [1, 2]}
    loads_bounded("[" * 1000 + "]" * 1000)    # JSONNestingError: nested deeper than 64 ...
    loads_object("[1]")                       # NotJSONObjectError: not a JSON object but a list
"""

from __future__ import annotations

import json
from typing import Any, cast

__all__ = [
    "MAX_JSON_DEPTH",
    "JSONNestingError",
    "NotJSONObjectError",
    "loads_bounded",
    "loads_object",
    "nesting_error",
]

MAX_JSON_DEPTH = 64
"""How deep arrays and objects may nest in a data row or request body (a chat row needs 5)."""


class JSONNestingError(ValueError):
    """JSON text nested deeper than the limit: ``depth`` reached at character ``position`` (0-based)."""

    def __init__(self, limit: int, position: int) -> None:
        self.limit = limit
        self.position = position
        super().__init__(
            f"JSON nested deeper than {limit} levels (arrays/objects) at character {position + 1}; "
            "a row this deep is almost certainly malformed"
        )


def nesting_error(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> JSONNestingError | None:
    """The error for ``text`` if its arrays and objects nest deeper than ``max_depth``, else None.

    Brackets inside strings do not count. Only the structure is scanned, not validated.
    """
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return None
    depth = 0
    in_string = False
    escaped = False
    for position, byte in enumerate(raw):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > max_depth:
                return JSONNestingError(max_depth, position)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return None


def loads_bounded(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> object:
    """``json.loads(text)``, refusing text nested deeper than ``max_depth`` (:class:`JSONNestingError`).

    Other malformed text raises ``json.JSONDecodeError`` as ``json.loads`` does.
    """
    error = nesting_error(text, max_depth)
    if error is not None:
        raise error
    return json.loads(text)


_KINDS: dict[type, str] = {
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
}


class NotJSONObjectError(ValueError):
    """Text that is not one JSON object: malformed (``lineno``: the 1-based line of the error in
    the text) or another JSON value (``lineno`` 1). The message says which, without the text's
    origin."""

    def __init__(self, message: str, lineno: int = 1) -> None:
        super().__init__(message)
        self.lineno = lineno


def loads_object(text: str) -> dict[str, Any]:
    """``text`` as a JSON object, or :class:`NotJSONObjectError`: ``not valid JSON (Expecting
    value at column 5)`` or ``not a JSON object but a list``."""
    try:
        value: object = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotJSONObjectError(f"not valid JSON ({exc.msg} at column {exc.colno})", exc.lineno) from None
    if not isinstance(value, dict):
        raise NotJSONObjectError(f"not a JSON object but {_KINDS.get(type(value), 'null')}")
    return cast("dict[str, Any]", value)
