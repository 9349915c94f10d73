"""``tempering export`` and ``tempering checkpoints``: weights out, and the store kept in bounds.

``tempering export CHECKPOINT OUT_DIR [--adapter]`` writes a Hugging Face model directory (LoRA
merged) or a PEFT adapter (:mod:`tempering.local.export`). CHECKPOINT is a ``tempering://``
path, a checkpoint directory, or a run directory (its final checkpoint, or ``--name``'s).

``tempering checkpoints list|show|rm|prune`` manage the local store (``--store``, default
``$TEMPERING_HOME`` or ``~/.cache/tempering``, which is also ``tempering serve --data-dir``'s
layout) or, given a run directory, that run's checkpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tempering.cli._units import age_s, size_text
from tempering.fs import path_kind

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    """Add ``export`` and ``checkpoints`` to the ``tempering`` argparse subparsers ``sub``."""
    exp = sub.add_parser(
        "export",
        help="write a checkpoint out as a Hugging Face model (LoRA merged), or a PEFT adapter (--adapter)",
    )
    exp.add_argument("checkpoint", help="a tempering:// path, a checkpoint directory, or a run directory")
    exp.add_argument("out_dir", help="the directory to write (must not exist, or be empty)")
    exp.add_argument("--adapter", action="store_true", help="write the LoRA adapter alone (PEFT format)")
    exp.add_argument(
        "--name", default=None, help="with a run directory: the checkpoint's name (default: final)"
    )
    exp.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    exp.add_argument("--store", default=None, help="the checkpoint store (default $TEMPERING_HOME)")
    _remote_flags(exp, hosted=False)
    exp.set_defaults(func=_export)

    ck = sub.add_parser("checkpoints", help="list, show, remove or prune checkpoints (local store or a run)")
    ck_sub = ck.add_subparsers(dest="action", required=True)
    ls = ck_sub.add_parser("list", help="checkpoints with their size; the store's total")
    ls.add_argument("run_dir", nargs="?", default=None, help="a run directory (default: the whole store)")
    ls.add_argument("--run", default=None, help="only this run id of the store")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    show = ck_sub.add_parser("show", help="one checkpoint's metadata and files")
    show.add_argument("path", help="a tempering:// path or a checkpoint directory")
    rm = ck_sub.add_parser("rm", help="remove checkpoints")
    rm.add_argument("paths", nargs="+", help="tempering:// paths")
    prune = ck_sub.add_parser(
        "prune", help="remove old checkpoints; the newest of each run (and a run's final) always stay"
    )
    prune.add_argument("run_dir", nargs="?", default=None, help="prune this run directory's checkpoints")
    prune.add_argument("--run", default=None, help="only this run id of the store")
    prune.add_argument("--keep-last", type=int, default=None, help="keep the newest N (per run and kind)")
    prune.add_argument("--older-than", default=None, help="only those older than this age: 30m, 12h, 7d, 2w")
    prune.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    for p in (ls, show, rm, prune):
        p.add_argument("--store", default=None, help="the checkpoint store (default $TEMPERING_HOME)")
        _remote_flags(p, hosted=True)
    ck.set_defaults(func=_checkpoints)


def _remote_flags(parser: Any, *, hosted: bool) -> None:
    parser.add_argument(
        "--base-url",
        default=None,
        help="a tempering serve (or other Tinker) server for tinker:// paths (default $TINKER_BASE_URL)",
    )
    parser.add_argument("--api-key", default=None, help="its API key (default $TINKER_API_KEY)")
    if hosted:
        parser.add_argument(
            "--hosted",
            action="store_true",
            help="the hosted Tinker service (TINKER_API_KEY), not the local store",
        )


def _remote(args: argparse.Namespace) -> Any:
    from tempering.local.remote import RemoteService

    return RemoteService(base_url=args.base_url, api_key=args.api_key)


def _is_remote(args: argparse.Namespace, paths: list[str]) -> bool:
    """Whether the command is about a service's checkpoints (``--base-url``, ``--hosted``, or
    ``tinker://`` paths) rather than the local store's."""
    if args.base_url is not None or getattr(args, "hosted", False):
        return True
    remote = [p for p in paths if _on_service(p)]
    if remote and len(remote) != len(paths):
        raise ValueError("give tinker:// paths (a service's) or tempering:// paths (the store's), not both")
    return bool(remote)


def _on_service(path: str) -> bool:
    """Whether ``path`` is a checkpoint of the Tinker SDK's service (the hosted one or
    ``tempering serve``; by ``Capabilities.checkpoint_schemes``), which the REST client handles."""
    from tempering.backends.hosted import HOSTED

    return HOSTED.capabilities.owns_path(path)


def _store(args: argparse.Namespace) -> Any:
    from tempering.local.checkpoints import CheckpointStore

    return CheckpointStore(args.store)


def _is_run_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "checkpoints.jsonl").is_file()


def _resolve_checkpoint(spec: str, name: str | None) -> tuple[str, dict[str, Any] | None]:
    """The checkpoint path ``spec`` names, and the run's config when it is a run directory."""
    from tempering.training.rundir import RunDir

    path = Path(spec).expanduser()
    if "://" in spec or not _is_run_dir(path):
        if name is not None:
            raise SystemExit(f"tempering export: --name applies to a run directory; {spec} is not one")
        return spec, None
    records = RunDir(path).checkpoints()
    if not records:
        raise SystemExit(f"tempering export: {path} has no checkpoints yet (checkpoints.jsonl is empty)")
    if name is None:
        finals = [r for r in records if r.final]
        record = finals[-1] if finals else records[-1]
    else:
        matches = [r for r in records if r.name == name]
        if not matches:
            known = ", ".join(r.name for r in records)
            raise SystemExit(f"tempering export: {path} has no checkpoint named {name!r}; it has: {known}")
        record = matches[-1]
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return record.state_path, config if isinstance(config, dict) else None


def _export(args: argparse.Namespace) -> int:
    import tinker

    from tempering.local.errors import LocalEngineError
    from tempering.local.export import export_checkpoint

    checkpoint, run_config = _resolve_checkpoint(args.checkpoint, args.name)
    try:
        if _on_service(checkpoint):
            from tempering.local.remote import export_remote

            out = export_remote(
                checkpoint, args.out_dir, _remote(args), adapter=args.adapter,
                run_config=run_config, overwrite=args.overwrite,
            )  # fmt: skip
        else:
            out = export_checkpoint(
                checkpoint, args.out_dir, adapter=args.adapter, store=_store(args),
                run_config=run_config, overwrite=args.overwrite,
            )  # fmt: skip
    except (LocalEngineError, FileNotFoundError, ValueError, tinker.TinkerError) as exc:
        print(f"tempering export: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {'a PEFT adapter' if out.kind == 'adapter' else 'a Hugging Face model'} to {out.out_dir}")
    print(f"  from {checkpoint} (base model {out.base_model}); files: {', '.join(out.files)}")
    return 0


def _checkpoints(args: argparse.Namespace) -> int:
    import tinker

    from tempering.local.errors import LocalEngineError

    try:
        if _is_remote(args, list(getattr(args, "paths", None) or [getattr(args, "path", "")])):
            from tempering.cli.weights_remote import remote_action

            return remote_action(args, _remote(args))
        if args.action == "list":
            return _list(args)
        if args.action == "show":
            return _show(args)
        if args.action == "rm":
            return _rm(args)
        return _prune(args)
    except (LocalEngineError, ValueError, FileNotFoundError, tinker.TinkerError) as exc:
        print(f"tempering checkpoints {args.action}: {exc}", file=sys.stderr)
        return 2


def _list(args: argparse.Namespace) -> int:
    from tempering.local.inventory import list_stored

    if args.run_dir is not None:
        from tempering.training.rundir import RunDir

        if not _is_run_dir(Path(args.run_dir)):
            raise SystemExit(
                f"tempering checkpoints list: {args.run_dir} is {path_kind(args.run_dir)}, not a run "
                "directory (no config.json and checkpoints.jsonl)"
            )
        for r in RunDir(args.run_dir).checkpoints():
            final = " final" if r.final else ""
            print(f"{r.name:<14} step {r.step:>6}{final}  {r.state_path}")
        return 0
    stored = list_stored(_store(args), args.run)
    for c in stored:
        if args.json:
            print(
                json.dumps(
                    {"path": c.path, "size_bytes": c.size_bytes, "mtime": c.mtime, "ok": c.meta is not None}
                )
            )
            continue
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.mtime))
        base = c.meta.base_model if c.meta is not None else "(unreadable meta.json)"
        print(f"{c.path:<64} {size_text(c.size_bytes):>9}  {when}  {base}")
    total = sum(c.size_bytes for c in stored)
    if not args.json:
        print(f"{len(stored)} checkpoints, {size_text(total)} in {_store(args).root}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from tempering.local.inventory import directory_size

    store = _store(args)
    directory = store.resolve(args.path)
    meta = store.read_meta(args.path)
    print(json.dumps({"path": args.path, "directory": str(directory), **meta.to_json()}, indent=2))
    for f in sorted(directory.iterdir()):
        print(f"  {f.name:<24} {size_text(f.stat().st_size):>9}")
    print(f"  total {size_text(directory_size(directory))}")
    return 0


def _rm(args: argparse.Namespace) -> int:
    from tempering.local.inventory import remove_checkpoint

    store = _store(args)
    freed = 0
    for path in args.paths:
        freed += remove_checkpoint(store, path)
        print(f"removed {path}")
    print(f"freed {size_text(freed)}")
    return 0


def _prune(args: argparse.Namespace) -> int:
    older = None if args.older_than is None else age_s(args.older_than)
    if args.run_dir is not None:
        from tempering.local.inventory import remove_checkpoint
        from tempering.training.retention import prune_run
        from tempering.training.rundir import RunDir

        if args.keep_last is None or older is not None:
            raise SystemExit(
                "tempering checkpoints prune RUN_DIR: give --keep-last N (ages apply to the store)"
            )
        run = RunDir(args.run_dir)
        if not _is_run_dir(run.path):
            raise SystemExit(
                f"tempering checkpoints prune: {run.path} is {path_kind(run.path)}, not a run directory "
                "(no config.json and checkpoints.jsonl)"
            )
        store = _store(args)
        run.lock()  # a trainer writing the run refuses the prune (RunLockedError, named)
        try:
            removed = prune_run(
                run, args.keep_last, remove=lambda p: _drop(store, p, remove_checkpoint), dry_run=args.dry_run
            )
        finally:
            run.close()
        verb = "would remove" if args.dry_run else "removed"
        for r in removed:
            print(f"{verb} {r.name} (step {r.step}): {r.state_path}")
        kept = len(run.checkpoints()) - (len(removed) if args.dry_run else 0)
        print(f"{verb} {len(removed)} of the run's checkpoints; kept {kept}")
        return 0
    from tempering.local.inventory import prune_store

    chosen = prune_store(
        _store(args), run_id=args.run, keep_last=args.keep_last, older_than_s=older, dry_run=args.dry_run
    )
    verb = "would remove" if args.dry_run else "removed"
    for c in chosen:
        print(f"{verb} {c.path} ({size_text(c.size_bytes)})")
    print(f"{verb} {len(chosen)} checkpoints, {size_text(sum(c.size_bytes for c in chosen))}")
    return 0


def _drop(store: Any, path: str, remove: Any) -> None:
    if _on_service(path):
        raise ValueError(
            f"{path} is on a service: pass --base-url URL (tempering serve) or --hosted to delete it there"
        )
    remove(store, path)
