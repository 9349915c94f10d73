"""Which optional extras a ``tempering`` command needs, and the one line that names the missing ones.

A bare ``pip install tempering`` lacks the ``local`` extra (the in-process engine) and the
``view`` extra (the run page); a command that needs both names both in one install line
(``pip install 'tempering[local,view]'``) rather than one after the other. Whether a module is
installed is asked of the import system (``importlib.util.find_spec``), nothing is imported.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

__all__ = ["EXTRAS", "missing_extras", "missing_message"]

EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "local": ("the local engine", ("torch", "transformers", "peft", "safetensors", "tokenizers", "gguf")),
    "view": ("the run page", ("plotly", "starlette", "uvicorn")),
    "serve": ("the server", ("starlette", "uvicorn")),
}
"""extra → (what it is for, the top-level modules it installs)."""

_COMMANDS: dict[str, tuple[str, ...]] = {
    "demo": ("local", "view"),  # the demo trains on the local engine and writes its page
    "view": ("view",),
    "tiny-model": ("local",),
    "serve": ("local", "serve"),
    **{c: ("local",) for c in ("sft", "dpo", "rm", "rl", "recipe", "eval")},
}
HOSTED = frozenset({"sft", "dpo", "rm", "rl", "recipe", "eval"})
"""Commands that train on the hosted service instead when ``TINKER_API_KEY`` is set."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses the name: not importable
        return False


def missing_extras(command: str) -> dict[str, list[str]]:
    """The extras ``command`` needs that are not installed → their missing modules (``local``
    is not needed by a command that trains on a backend that does not need it: the hosted
    service, ``TINKER_API_KEY`` set; ``Capabilities.extra``)."""
    from tempering.backends import selected_backend

    out: dict[str, list[str]] = {}
    for extra in _COMMANDS.get(command, ()):
        if extra == "local" and command in HOSTED and selected_backend().capabilities.extra != "local":
            continue
        gone = [m for m in EXTRAS[extra][1] if not _installed(m)]
        if gone:
            out[extra] = gone
    return out


def missing_message(command: str, missing: dict[str, list[str]], *, first: Sequence[str] = ()) -> str:
    """One line naming every missing extra of ``command`` and the one ``pip install`` that adds
    them all, e.g. ``tempering demo: needs the `local` extra (the local engine: 'torch' is not
    installed) and the `view` extra (…): pip install 'tempering[local,view]'``. ``first``: a
    module known missing (an ``ImportError`` already met), named first in its extra."""
    parts: list[str] = []
    for extra, modules in missing.items():
        names = [*(m for m in first if m in modules), *(m for m in modules if m not in first)]
        shown = ", ".join(repr(m) for m in names[:3]) + (", …" if len(names) > 3 else "")
        verb = "is" if len(names) == 1 else "are"
        parts.append(f"the `{extra}` extra ({EXTRAS[extra][0]}: {shown} {verb} not installed)")
    line = f"tempering {command}: needs " + " and ".join(parts)
    line += f": pip install 'tempering[{','.join(missing)}]'"
    if "local" in missing and command in HOSTED:
        line += "; or set TINKER_API_KEY to train on the hosted Tinker service"
    return line
