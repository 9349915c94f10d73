"""Keeping a run's checkpoints in bounds: which of a run directory's checkpoints may go.

A run's index (``checkpoints.jsonl``) lists its checkpoints oldest first. :func:`prune_run`
removes all but the newest ``keep_last`` periodic ones (so never the newest, which a resume
starts from), and never a final checkpoint (``final: true``, written at the end of a run);

deletes their saved weights through ``remove`` (a callable that knows the path's scheme), and
rewrites the index without them, atomically. ``RunConfig.keep_last`` applies it after every
periodic save; ``tempering checkpoints prune RUN_DIR --keep-last N`` applies it by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tempering.training.rundir import CheckpointRecord, RunDir

__all__ = ["checkpoint_remover", "prunable", "prune_run"]

log = logging.getLogger(__name__)


def checkpoint_remover(client: object) -> Callable[[str], None]:
    """A ``remove`` for :func:`prune_run` that deletes what ``client`` saved: ``tempering://``
    paths and checkpoint directories from the local engine's store (the client's own, when it
    is a local training client). ``tinker://`` paths are left to the hosted service's own
    expiry (a warning says so once): deleting them needs its REST client
    (``tempering checkpoints rm``)."""
    from tempering.local.checkpoints import CheckpointStore
    from tempering.local.inventory import remove_checkpoint

    store = getattr(client, "checkpoint_store", None)
    local = store if isinstance(store, CheckpointStore) else CheckpointStore()
    warned: list[bool] = []

    def remove(path: str) -> None:
        if path.startswith("tinker://"):
            if not warned:
                warned.append(True)
                log.warning(
                    "keep_last: %s and other tinker:// checkpoints are not deleted by the trainer; "
                    "remove them with `tempering checkpoints rm` or let the service expire them",
                    path,
                )
            raise _KeptRemotelyError(path)
        remove_checkpoint(local, path)

    return remove


class _KeptRemotelyError(Exception):
    """A checkpoint on a remote service that the remover leaves where it is."""


def prunable(records: list[CheckpointRecord], keep_last: int) -> list[CheckpointRecord]:
    """The records of ``records`` (oldest first) that pruning to ``keep_last`` removes."""
    if keep_last < 1:
        raise ValueError(
            f"keep_last must be >= 1 (a run keeps the checkpoint it resumes from), got {keep_last}"
        )
    periodic = [r for r in records if not r.final]
    kept = {r.name for r in periodic[-keep_last:]}
    return [r for r in periodic if r.name not in kept]


def prune_run(
    run: RunDir, keep_last: int, *, remove: Callable[[str], None], dry_run: bool = False
) -> list[CheckpointRecord]:
    """Prune ``run``'s checkpoints to the newest ``keep_last`` (see the module docstring);
    return the records removed (with ``dry_run``: that would be). A path that ``remove``
    cannot delete keeps its record in the index, and its error is raised after the rest."""
    records = run.checkpoints()
    doomed = prunable(records, keep_last)
    if dry_run or not doomed:
        return doomed
    removed: list[CheckpointRecord] = []
    failure: Exception | None = None
    for record in doomed:
        try:
            for path in (record.state_path, record.sampler_path):
                if path:
                    remove(path)
        except _KeptRemotelyError:
            continue
        except Exception as exc:  # keep going; report the first failure after the index is right
            failure = failure or exc
            continue
        removed.append(record)
    gone = {r.name for r in removed}
    run.replace_checkpoints([r for r in records if r.name not in gone])
    if failure is not None:
        raise failure
    return removed
