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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tempering", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main job on the local engine")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
