"""What the local checkpoint store holds, how big it is, and pruning it.

The store (``$TEMPERING_HOME``, else ``~/.cache/tempering``; see
:mod:`tempering.local.checkpoints`) only grows while runs save checkpoints. :func:`list_stored`
lists them with their size; :func:`prune_store` removes the ones a rule selects, and never the
newest checkpoint of a run (of each kind), so a run that is still going, or one that would be
resumed, keeps the checkpoint it resumes from.

Example::

    store = CheckpointStore()
    for c in list_stored(store):
        print(c.path, c.size_bytes)
    removed = prune_store(store, keep_last=2)            # per run and kind
    removed = prune_store(store, older_than_s=7 * 86400)  # older than a week
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tempering.local.checkpoints import SCHEME, CheckpointMeta, CheckpointStore
from tempering.local.errors import CheckpointNotFoundError

__all__ = [
    "StoredCheckpoint",
    "directory_size",
    "list_stored",
    "prune_store",
    "remove_checkpoint",
    "select_for_pruning",
]

_C = TypeVar("_C")


@dataclass(frozen=True)
class StoredCheckpoint:
    """One checkpoint of the store."""

    path: str
    """Its ``tempering://<run_id>/<kind>/<name>`` path."""
    run_id: str
    kind: str
    name: str
    directory: Path
    meta: CheckpointMeta | None
    """``None`` when ``meta.json`` is missing or unreadable (a half-removed checkpoint)."""
    size_bytes: int
    mtime: float


def directory_size(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_stored(store: CheckpointStore, run_id: str | None = None) -> list[StoredCheckpoint]:
    """Every checkpoint in ``store`` (of ``run_id`` only, when given), oldest first."""
    base = store.root / "checkpoints"
    if not base.is_dir():
        return []
    out: list[StoredCheckpoint] = []
    for run_dir in sorted(base.iterdir()):
        if not run_dir.is_dir() or (run_id is not None and run_dir.name != run_id):
            continue
        for kind in ("weights", "sampler_weights"):
            kind_dir = run_dir / kind
            if not kind_dir.is_dir():
                continue
            for ckpt in kind_dir.iterdir():
                if not ckpt.is_dir() or ckpt.name.startswith("."):
                    continue
                path = f"{SCHEME}{run_dir.name}/{kind}/{ckpt.name}"
                try:
                    meta: CheckpointMeta | None = store.read_meta(path)
                except (CheckpointNotFoundError, ValueError, OSError):
                    meta = None
                out.append(
                    StoredCheckpoint(
                        path=path,
                        run_id=run_dir.name,
                        kind=kind,
                        name=ckpt.name,
                        directory=ckpt,
                        meta=meta,
                        size_bytes=directory_size(ckpt),
                        mtime=ckpt.stat().st_mtime,
                    )
                )
    out.sort(key=lambda c: (c.mtime, c.path))
    return out


def remove_checkpoint(store: CheckpointStore, path: str) -> int:
    """Delete the checkpoint at ``path`` (a ``tempering://`` path); return the bytes freed.
    The directory is first renamed aside, so a reader never sees half of it."""
    directory = store.resolve(path)
    size = directory_size(directory)
    aside = directory.with_name(f".removing-{directory.name}")
    directory.rename(aside)
    shutil.rmtree(aside, ignore_errors=True)
    _remove_empty_parents(directory.parent, store.root / "checkpoints")
    return size


def _remove_empty_parents(directory: Path, stop: Path) -> None:
    while directory != stop and directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()
        directory = directory.parent


def prune_store(
    store: CheckpointStore,
    *,
    run_id: str | None = None,
    keep_last: int | None = None,
    older_than_s: float | None = None,
    keep: Sequence[str] = (),
    dry_run: bool = False,
    now: float | None = None,
) -> list[StoredCheckpoint]:
    """Remove checkpoints chosen by the rules, all of which must hold for one to go:

    - ``run_id``: only that run's;
    - ``keep_last``: all but the newest ``keep_last`` of each run and kind;
    - ``older_than_s``: only those last written more than that many seconds ago.

    The newest checkpoint of each run and kind is never removed, nor any path in ``keep``.
    At least one of ``keep_last`` / ``older_than_s`` must be given. Returns what was (with
    ``dry_run``: would be) removed."""
    chosen = select_for_pruning(
        list_stored(store, run_id),
        group=lambda c: (c.run_id, c.kind),
        mtime=lambda c: c.mtime,
        path=lambda c: c.path,
        keep_last=keep_last,
        older_than_s=older_than_s,
        keep=keep,
        now=time.time() if now is None else now,
    )
    if not dry_run:
        for c in chosen:
            remove_checkpoint(store, c.path)
    return chosen


def select_for_pruning(
    items: Iterable[_C],
    *,
    group: Callable[[_C], Hashable],
    mtime: Callable[[_C], float],
    path: Callable[[_C], str],
    keep_last: int | None,
    older_than_s: float | None,
    now: float,
    keep: Sequence[str] = (),
) -> list[_C]:
    """The items the prune rules of :func:`prune_store` choose, oldest first: per ``group``
    (a run and kind), all but the newest ``keep_last`` (never the newest one), and only those
    older than ``older_than_s``; never a path in ``keep``. Shared by the local store and the
    REST client's listing (:mod:`tempering.local.remote`)."""
    if keep_last is None and older_than_s is None:
        raise ValueError("prune needs a rule: keep_last=N and/or older_than_s=SECONDS")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 (the newest checkpoint of a run is kept), got {keep_last}")
    groups: dict[Hashable, list[_C]] = {}
    for item in items:
        groups.setdefault(group(item), []).append(item)
    chosen: list[_C] = []
    for members in groups.values():
        newest_first = sorted(members, key=lambda c: (mtime(c), path(c)), reverse=True)
        protected = 1 if keep_last is None else keep_last
        for c in newest_first[protected:]:
            if path(c) in keep:
                continue
            if older_than_s is not None and now - mtime(c) <= older_than_s:
                continue
            chosen.append(c)
    chosen.sort(key=lambda c: (mtime(c), path(c)))
    return chosen
