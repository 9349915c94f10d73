"""Checkpoints on a Tinker service (the hosted one, or ``tempering serve``), through the official
SDK's ``RestClient``: list, inspect, delete, prune, and download for export.

Which service: ``base_url`` (a ``tempering serve`` URL, or ``$TINKER_BASE_URL``), else the SDK's
default, the hosted service; the key is ``api_key``, else ``$TINKER_API_KEY``.

Downloading follows the official ``tinker checkpoint download``: a ``tinker://…/weights/…``
(``save_state``) checkpoint is loaded into a new training client, saved with
``save_weights_external`` under a temporary name (with a one-hour TTL), its files fetched from
the signed URLs ``get_external_weights_urls`` answers, and the temporary export deleted. A
``tinker://…/external_weights/…`` path is fetched as it is.

Example::

    remote = RemoteService(base_url="http://127.0.0.1:8000", api_key="tml-local")
    for c in list_remote(remote):
        print(c.tinker_path, c.size_bytes)
    export_remote("tinker://run-1f2e/weights/final", "exported/", remote)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tinker
from tinker import types as ttypes

from tempering.local.errors import CheckpointNotFoundError
from tempering.local.export import ExportedModel, ExportError, check_out_dir, export_downloaded
from tempering.local.inventory import select_for_pruning

__all__ = [
    "RemoteService",
    "delete_remote",
    "download_checkpoint",
    "export_remote",
    "list_remote",
    "prune_remote",
    "run_of_path",
]

_EXPORT_TTL_S = 3600
"""The temporary export's lifetime on the service (the hosted minimum), should deleting it fail."""
_PAGE = 100


@dataclass(frozen=True)
class RemoteService:
    """Where the checkpoints are (see the module docstring)."""

    base_url: str | None = None
    api_key: str | None = None

    def key(self) -> str:
        key = self.api_key or os.environ.get("TINKER_API_KEY")
        if not key:
            where = self.base_url or os.environ.get("TINKER_BASE_URL") or "the hosted service"
            raise ValueError(
                f"no API key for {where}: pass --api-key (tempering serve prints its key at start) "
                "or set TINKER_API_KEY"
            )
        return key

    def url(self) -> str | None:
        return self.base_url or os.environ.get("TINKER_BASE_URL") or None

    def describe(self) -> str:
        return self.url() or "the hosted Tinker service"

    def rest(self) -> tinker.RestClient:
        return tinker.RestClient(base_url=self.url(), api_key=self.key())

    def service(self) -> tinker.ServiceClient:
        return tinker.ServiceClient(base_url=self.url(), api_key=self.key())


def _parse(tinker_path: str) -> ttypes.ParsedCheckpointTinkerPath:
    try:
        return ttypes.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
    except ValueError as exc:
        raise CheckpointNotFoundError(
            f"{tinker_path!r} is not a checkpoint path: expected "
            "tinker://<run_id>/weights/<name> (or sampler_weights/, external_weights/)"
        ) from exc


def list_remote(remote: RemoteService, run_id: str | None = None) -> list[ttypes.Checkpoint]:
    """The service's checkpoints (of ``run_id`` only, when given), oldest first."""
    rest = remote.rest()
    if run_id is not None:
        found = list(rest.list_checkpoints(run_id).result().checkpoints)
    else:
        found = []
        while True:
            page = rest.list_user_checkpoints(limit=_PAGE, offset=len(found)).result()
            found += page.checkpoints
            total = page.cursor.total_count if page.cursor is not None else len(found)
            if not page.checkpoints or len(found) >= total:
                break
    return sorted(found, key=lambda c: (c.time, c.tinker_path))


def run_of_path(tinker_path: str) -> str:
    """The training run id in a ``tinker://`` checkpoint path."""
    return _parse(tinker_path).training_run_id


def delete_remote(remote: RemoteService, tinker_paths: Sequence[str]) -> None:
    """Delete each checkpoint; an unknown path is an error naming it (the others still go)."""
    rest = remote.rest()
    failures: list[str] = []
    for path in tinker_paths:
        _parse(path)
        try:
            rest.delete_checkpoint_from_tinker_path(path).result()
        except tinker.APIStatusError as exc:
            failures.append(f"{path}: {exc.status_code} {_detail(exc)}")
    if failures:
        raise CheckpointNotFoundError("could not delete " + "; ".join(failures))


def _detail(exc: tinker.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, Mapping) and "detail" in body:
        return str(body["detail"])  # pyright: ignore[reportUnknownArgumentType]
    return str(exc.message)


def prune_remote(
    remote: RemoteService,
    *,
    run_id: str | None = None,
    keep_last: int | None = None,
    older_than_s: float | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> list[ttypes.Checkpoint]:
    """Delete the checkpoints the rules choose (as :func:`tempering.local.inventory.prune_store`:
    per run and type, never the newest); return them."""
    found = list_remote(remote, run_id)
    chosen = select_for_pruning(
        found,
        group=lambda c: (run_of_path(c.tinker_path), c.checkpoint_type),
        mtime=lambda c: c.time.timestamp(),
        path=lambda c: c.tinker_path,
        keep_last=keep_last,
        older_than_s=older_than_s,
        now=time.time() if now is None else now,
    )
    if not dry_run and chosen:
        delete_remote(remote, [c.tinker_path for c in chosen])
    return chosen


@dataclass(frozen=True)
class Downloaded:
    """What :func:`download_checkpoint` fetched."""

    directory: Path
    files: tuple[str, ...]
    info: ttypes.WeightsInfoResponse


def download_checkpoint(remote: RemoteService, tinker_path: str, dest: Path) -> Downloaded:
    """Fetch ``tinker_path``'s weights in Hugging Face format into ``dest`` (see the module
    docstring)."""
    parsed = _parse(tinker_path)
    if parsed.checkpoint_type == "sampler":
        raise ExportError(
            f"{tinker_path} was saved for sampling (save_weights_for_sampler), which the service "
            "does not export; export the run's save_state path (tinker://<run>/weights/<name>)"
        )
    rest = remote.rest()
    try:
        info = rest.get_weights_info_by_tinker_path(tinker_path).result()
    except tinker.NotFoundError as exc:
        raise CheckpointNotFoundError(f"{tinker_path}: not on {remote.describe()} ({_detail(exc)})") from exc
    if parsed.checkpoint_type == "external":
        return Downloaded(dest, _fetch_all(rest, tinker_path, dest), info)
    service = remote.service()
    status: str = "errored"
    try:
        trainer = service.create_training_client_from_state(tinker_path).result()
        name = f"tempering-export-{uuid.uuid4().hex[:12]}"
        export_path = trainer.save_weights_external(name, ttl_seconds=_EXPORT_TTL_S).result().path
        try:
            files = _fetch_all(rest, export_path, dest)
        finally:
            with contextlib.suppress(tinker.APIError):  # else it expires after _EXPORT_TTL_S
                rest.delete_checkpoint_from_tinker_path(export_path).result()
        status = "success"
        return Downloaded(dest, files, info)
    finally:
        service.close(status).result()  # pyright: ignore[reportArgumentType]


def _fetch_all(rest: tinker.RestClient, export_path: str, dest: Path) -> tuple[str, ...]:
    response = rest.get_external_weights_urls(export_path).result()
    if not response.urls:
        raise ExportError(f"{export_path} has no files")
    dest.mkdir(parents=True, exist_ok=True)
    base = dest.resolve()
    for name, url in sorted(response.urls.items()):
        target = (dest / name).resolve()
        if not target.is_relative_to(base):
            raise ExportError(f"{export_path}: unsafe file name {name!r} in the download list")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with urllib.request.urlopen(url, timeout=120) as answer, target.open("wb") as out:
                shutil.copyfileobj(answer, out, 1 << 20)
        except urllib.error.URLError as exc:
            raise ExportError(f"downloading {name} of {export_path} failed: {exc}") from exc
    return tuple(sorted(response.urls))


def export_remote(
    tinker_path: str,
    out_dir: str | os.PathLike[str],
    remote: RemoteService,
    *,
    adapter: bool = False,
    run_config: Mapping[str, object] | None = None,
    overwrite: bool = False,
) -> ExportedModel:
    """Download ``tinker_path`` and write it as :func:`tempering.local.export.export_checkpoint`
    does (merged Hugging Face model, or with ``adapter`` the PEFT adapter). Nothing is written
    to ``out_dir`` unless everything succeeded."""
    out = check_out_dir(out_dir, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}-download-", dir=out.parent))
    try:
        got = download_checkpoint(remote, tinker_path, scratch / "files")
        return export_downloaded(
            got.directory,
            out,
            origin=tinker_path,
            base_model=got.info.base_model,
            adapter=adapter,
            run_config=run_config,
            overwrite=overwrite,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
