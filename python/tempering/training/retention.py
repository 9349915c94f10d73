"""Keeping a run's checkpoints in bounds: which of a run directory's checkpoints may go.

A run's index (``checkpoints.jsonl``) lists its checkpoints oldest first. :func:`prune_run`
removes all but the newest ``keep_last`` periodic ones (so never the newest, which a resume
starts from), and never a final checkpoint (``final: true``, written at the end of a run);
deletes their saved weights through ``remove`` (:func:`checkpoint_remover`: as the path's
backend says, :mod:`tempering.backends`), and rewrites the index without them, atomically.
``RunConfig.keep_last`` applies it after every periodic save; ``tempering checkpoints prune
RUN_DIR --keep-last N`` applies it by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tempering.backends import backend_for_path
from tempering.training.rundir import CheckpointRecord, RunDir

__all__ = ["checkpoint_remover", "prunable", "prune_run"]

log = logging.getLogger(__name__)


def checkpoint_remover(client: object) -> Callable[[str], None]:
    """A ``remove`` for :func:`prune_run` that deletes what ``client`` saved, as the backend of
    each path says (:func:`tempering.backends.backend_for_path`): a backend that declares
    ``trainer_deletes_checkpoints`` deletes it (the local engine: ``tempering://`` paths and
    checkpoint directories, from the client's own store when it is a local training client);
    any other (the hosted service's ``tinker://`` paths) keeps it for the service's own expiry,
    and a warning says so once: deleting those needs the service's REST client
    (``tempering checkpoints rm``)."""
    warned: list[bool] = []

    def remove(path: str) -> None:
        backend = backend_for_path(path, client)
        if not backend.capabilities.trainer_deletes_checkpoints:
            if not warned:
                warned.append(True)
                log.warning(
                    "keep_last: %s and other checkpoints on %s are not deleted by the trainer; "
                    "remove them with `tempering checkpoints rm` or let the service expire them",
                    path,
                    backend.title or backend.name,
                )
            raise _KeptRemotelyError(path)
        backend.remove_checkpoint(path, client)

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
