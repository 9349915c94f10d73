"""The viewer's page (``page.html`` and its scripts: ``page.js``, the core; ``curves.js``,
``rollouts.js``, ``compare.js``): plotly.js from the installed ``plotly`` package (no CDN) and
the glue that draws the curves, the rollouts and the evaluation comparison from the JSON
endpoints (served) or from embedded data (a static file)."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Any

__all__ = ["page_html", "plotly_js"]


@functools.cache
def plotly_js() -> str:
    """plotly.js as shipped by the ``plotly`` Python package (the ``view`` extra)."""
    try:
        offline: Any = importlib.import_module("plotly.offline")
    except ImportError as exc:
        raise ImportError("tempering view needs plotly: pip install 'tempering[view]'") from exc
    return str(offline.get_plotlyjs())


_HERE = Path(__file__).parent
_SCRIPTS = ("page.js", "curves.js", "rollouts.js", "compare.js")


def page_html(data_json: str | None) -> str:
    """The page (``page.html`` with its scripts inlined): served (``data_json`` None: it loads
    ``/plotly.js`` and polls the endpoints) or static (plotly.js and ``data_json`` inlined)."""
    if data_json is None:
        head = '<script src="/plotly.js"></script><script>const DATA = null;</script>'
    else:
        safe = data_json.replace("</", "<\\/")
        head = f"<script>{plotly_js()}</script><script>const DATA = {safe};</script>"
    template = (_HERE / "page.html").read_text(encoding="utf-8")
    script = "<script>" + "\n".join((_HERE / f).read_text(encoding="utf-8") for f in _SCRIPTS) + "</script>"
    return template.replace("<!--HEAD-->", head, 1).replace('<script src="page.js"></script>', script, 1)
