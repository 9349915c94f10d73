"""Plain-prose ``--help``: the configs' docstrings are reST (``x``, :class:`X`, ``Example::``)
written for the API docs; the command line shows them as plain text.

tyro reads a config's help from its docstrings; :func:`plain_help` wraps tyro's two docstring
readers so that what they return is converted by :func:`plain`. If a tyro release renames
them, the help stays as written (nothing breaks).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

__all__ = ["plain", "plain_help"]

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|obj|exc|ref):`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`_")


def _role(match: re.Match[str]) -> str:
    tilde, target = match.group(1), match.group(2)
    return target.rsplit(".", 1)[-1] if tilde else target


def plain(text: str) -> str:
    """``text`` (reST) as plain prose for a terminal: roles and literals lose their markup
    (``:class:`~a.B``` → ``B``, double backquotes → none), ``Example::`` becomes
    ``Example:``, the lines of a paragraph are joined (a literal block keeps its lines), and
    blank lines are dropped, so a help box has no empty rows.

    Example::

        plain("Uses ``--x`` with :func:`~tempering.rl.train`.\\n\\nExample::")
        # 'Uses --x with train.\\nExample:'
    """
    text = _ROLE.sub(_role, text)
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = re.sub(r"(\S)::(\s*(\n|$))", r"\1:\2", text)
    text = re.sub(r"(?m)^\s*::\s*$\n?", "", text)
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text.strip()):
        lines = [line.rstrip() for line in para.splitlines() if line.strip()]
        if lines and all(line.startswith((" ", "\t")) for line in lines):
            out.append("\n".join(lines))  # a literal block (an example): keep its lines
        elif lines:
            out.append(" ".join(line.strip() for line in lines))
    return "\n".join(out)


def _description(obj: object, description: str) -> str:
    """A class's description, re-read with its roles resolved first: the docstring parser that
    tyro uses takes a line starting with a role (``:func:`f```) for a field list, which would
    cut the description at that line."""
    doc = getattr(obj, "__doc__", None)
    if not (description and isinstance(doc, str) and re.search(r"(?m)^\s*:[a-z]+:`", doc)):
        return description
    import docstring_parser

    return docstring_parser.parse(_ROLE.sub(_role, doc)).description or description


def _wrapped(reader: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(reader)
    def read(*args: Any, **kwargs: Any) -> Any:
        out = reader(*args, **kwargs)
        if reader.__name__ == "get_callable_description" and args and isinstance(out, str):
            out = _description(args[0], out)
        return plain(out) if isinstance(out, str) else out

    read.__dict__["_tempering_plain"] = True
    return read


def plain_help() -> None:
    """Make tyro show docstrings as plain prose (idempotent; call before ``tyro.cli``)."""
    try:
        from tyro import _docstrings
    except ImportError:  # pragma: no cover - tyro always has it today
        return
    for name in ("get_field_docstring", "get_callable_description"):
        reader = getattr(_docstrings, name, None)
        if callable(reader) and not getattr(reader, "_tempering_plain", False):
            setattr(_docstrings, name, _wrapped(reader))
