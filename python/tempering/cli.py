"""The ``tempering`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(_args: argparse.Namespace) -> int:
    print(
        "tempering demo: the main job (SFT warm start on arithmetic, then RL with verifiable "
        "rewards, on the local engine) is not built yet; this placeholder exits cleanly."
    )
    return 0


def _tiny_model(args: argparse.Namespace) -> int:
    from tempering.local.tiny import build_tiny_model

    path = build_tiny_model(args.directory, seed=args.seed)
    print(f"wrote the tiny model and its tokenizer to {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tempering", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main job on the local engine")
    demo.set_defaults(func=_demo)
    tiny = sub.add_parser("tiny-model", help="write the built-in tiny model to a directory")
    tiny.add_argument("directory", help="where to write it (created if needed)")
    tiny.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    tiny.set_defaults(func=_tiny_model)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
