"""``tempering view RUN_DIR [RUN_DIR...] [--port P] [--host H] [--static OUT.html]``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_commands"]


def _view(args: argparse.Namespace) -> int:
    from tempering.view import NotARunError, PortInUseError, serve, write_static

    try:
        if args.static:
            out = write_static(args.run_dirs, args.static)
            print(f"wrote {out}")
            return 0
        return serve(args.run_dirs, host=args.host, port=args.port)
    except (NotARunError, PortInUseError) as exc:
        print(f"tempering view: {exc}", file=sys.stderr)
        return 2


def add_commands(sub: Any) -> None:
    """Add ``view`` to the ``tempering`` subcommands (an argparse subparsers object)."""
    view = sub.add_parser("view", help="a page of runs' curves, rollouts and checkpoints (docs/view.md)")
    view.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (several: overlaid)")
    view.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    view.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    view.add_argument(
        "--static", default=None, metavar="OUT.html", help="write the page once to a file and exit"
    )
    view.set_defaults(func=_view)
