"""``tempering checkpoints list|show|rm|prune`` on a service's checkpoints (``--base-url`` for a
``tempering serve``, ``--hosted`` for the hosted service, or ``tinker://`` paths), through the
official SDK's ``RestClient`` (:mod:`tempering.local.remote`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["remote_action"]


def remote_action(args: argparse.Namespace, remote: Any) -> int:
    """Run ``args.action`` against ``remote`` (a :class:`tempering.local.remote.RemoteService`)."""
    if args.action == "list":
        return _list(args, remote)
    if args.action == "show":
        return _show(args, remote)
    if args.action == "rm":
        from tempering.local.remote import delete_remote

        delete_remote(remote, args.paths)
        for path in args.paths:
            print(f"removed {path}")
        return 0
    if args.run_dir is not None:
        return _prune_run_dir(args, remote)
    return _prune(args, remote)


def _list(args: argparse.Namespace, remote: Any) -> int:
    from tempering.cli._units import size_text
    from tempering.local.remote import list_remote

    if args.run_dir is not None:
        raise ValueError("a run directory lists its checkpoints without --base-url/--hosted")
    found = list_remote(remote, args.run)
    for c in found:
        if args.json:
            print(
                json.dumps(
                    {
                        "path": c.tinker_path,
                        "type": c.checkpoint_type,
                        "size_bytes": c.size_bytes,
                        "time": c.time.isoformat(),
                        "expires_at": None if c.expires_at is None else c.expires_at.isoformat(),
                    }
                )
            )
            continue
        size = "?" if c.size_bytes is None else size_text(c.size_bytes)
        expires = "" if c.expires_at is None else f"  expires {c.expires_at:%Y-%m-%d %H:%M}"
        print(f"{c.tinker_path:<64} {size:>9}  {c.time:%Y-%m-%d %H:%M}  {c.checkpoint_type}{expires}")
    total = sum(c.size_bytes or 0 for c in found)
    if not args.json:
        print(f"{len(found)} checkpoints, {size_text(total)} on {remote.describe()}")
    return 0


def _show(args: argparse.Namespace, remote: Any) -> int:
    from tempering.local.remote import list_remote, run_of_path

    info = remote.rest().get_weights_info_by_tinker_path(args.path).result()
    entry = next((c for c in list_remote(remote, run_of_path(args.path)) if c.tinker_path == args.path), None)
    shown: dict[str, Any] = {"path": args.path, "service": remote.describe(), **info.model_dump(mode="json")}
    if entry is not None:
        shown.update(entry.model_dump(mode="json", exclude={"tinker_path"}))
    print(json.dumps(shown, indent=2))
    return 0


def _prune(args: argparse.Namespace, remote: Any) -> int:
    from tempering.cli._units import age_s, size_text
    from tempering.local.remote import prune_remote

    older = None if args.older_than is None else age_s(args.older_than)
    chosen = prune_remote(
        remote, run_id=args.run, keep_last=args.keep_last, older_than_s=older, dry_run=args.dry_run
    )
    verb = "would remove" if args.dry_run else "removed"
    for c in chosen:
        print(f"{verb} {c.tinker_path} ({'?' if c.size_bytes is None else size_text(c.size_bytes)})")
    print(f"{verb} {len(chosen)} checkpoints, {size_text(sum(c.size_bytes or 0 for c in chosen))}")
    return 0


def _prune_run_dir(args: argparse.Namespace, remote: Any) -> int:
    """A run directory whose checkpoints are on the service: the run's retention rule, with
    the ``tinker://`` paths deleted through the REST client."""
    from tempering.backends.hosted import HOSTED
    from tempering.local.remote import delete_remote
    from tempering.training.retention import prune_run
    from tempering.training.rundir import RunDir

    if args.keep_last is None or args.older_than is not None:
        raise ValueError("tempering checkpoints prune RUN_DIR: give --keep-last N (ages apply to a store)")
    run = RunDir(args.run_dir)
    if not (run.path / "checkpoints.jsonl").is_file():
        raise ValueError(f"{run.path} is not a run directory (no checkpoints.jsonl)")

    def remove(path: str) -> None:
        if not HOSTED.capabilities.owns_path(path):
            raise ValueError(f"{path} is not on {remote.describe()}; prune it without --base-url/--hosted")
        delete_remote(remote, [path])

    removed = prune_run(run, args.keep_last, remove=remove, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for r in removed:
        print(f"{verb} {r.name} (step {r.step}): {r.state_path}")
    print(f"{verb} {len(removed)} of the run's checkpoints on {remote.describe()}")
    return 0
