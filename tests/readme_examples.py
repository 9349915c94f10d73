"""Run the README's Python examples, in order, in one namespace.

Used by ``tests/test_readme.py`` (in the development environment) and by ``make check-wheels``
(in a fresh virtualenv holding only the built wheels and their registry dependencies), so the
examples a new user copies work against what ``pip install`` gives them.

Usage: ``python tests/readme_examples.py [README.md]``
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(markdown: str) -> list[str]:
    """The bodies of the ```python fenced blocks of ``markdown``, in order."""
    return [m.group(1) for m in FENCE.finditer(markdown)]


def run(readme: Path) -> int:
    blocks = python_blocks(readme.read_text(encoding="utf-8"))
    if not blocks:
        raise SystemExit(f"{readme}: no ```python blocks found")
    # One real module, as a user's own file would be, so the classes it defines pickle.
    module = types.ModuleType("readme_example")
    sys.modules[module.__name__] = module
    for i, block in enumerate(blocks, 1):
        try:
            exec(compile(block, f"{readme}:python block {i}", "exec"), module.__dict__)
        except Exception as exc:
            raise SystemExit(f"{readme}: python block {i} failed: {type(exc).__name__}: {exc}") from exc
    return len(blocks)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "README.md"
    print(f"README examples ok: {run(path)} python blocks from {path}")
