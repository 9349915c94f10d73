"""The checkpoint routes of ``tempering serve``: what the SDK's ``RestClient`` (and the official
``tinker checkpoint`` CLI) call to list, inspect, export, download and delete checkpoints, in the
hosted API's shapes (tinker 0.38's ``types.Checkpoint``, ``CheckpointsListResponse``,
``TrainingRun``, ``WeightsInfoResponse``, ``ExternalWeightsUrlsResponse``).

The data directory's store holds ``checkpoints/<run_id>/<kind>/<name>/``; its ``tinker://``
paths are ``tinker://<run_id>/<kind>/<name>``, kind ``weights`` (``save_state``, type
``training``), ``sampler_weights`` (type ``sampler``) or ``external_weights`` (type
``external``). An external checkpoint is what ``save_weights_external`` writes: the weights in
Hugging Face format, here a PEFT adapter directory (``adapter_config.json``,
``adapter_model.safetensors``, model card) whose config names the base model's directory.

Downloads go as on the hosted service: ``external_weights_urls`` answers one signed URL per
file (an HMAC of the file and expiry under the server's API key), fetched without the key.
A checkpoint's TTL (``ttl_seconds`` on any save or copy, ``PUT .../ttl``) and ``user_metadata``
are kept in a ``tinker.json`` beside its files, a training run's ``user_metadata``
(``create_model``) in one beside its kinds; an expired checkpoint is removed at the next listing.

``copy_weights`` copies a checkpoint (either kind) into a new training run, sharing the files'
storage (hard links where the filesystem allows). It runs once per ``X-Idempotency-Key``, as the
SDK's retries expect. This server has no projects or accounts: ``destination_project_id`` is
recorded with the copy, and ``X-Tinker-Weights-Access-Token`` has nothing to unlock (every
checkpoint here is readable with the server's key).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import json
import os
import shutil
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pydantic
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from tinker import types as ttypes

from tempering.local.checkpoints import SCHEME, SIDECAR, read_sidecar, staged_dir, write_sidecar
from tempering.local.errors import LocalEngineError
from tempering.local.export import ExportError, export_checkpoint
from tempering.local.inventory import directory_size, remove_checkpoint
from tempering.local.training import LocalTrainingClient
from tempering.serve.engine import Engine, Payload, RequestError
from tempering.serve.state import check_ttl, remember

__all__ = ["URL_LIFETIME_S", "checkpoint_routes"]

URL_LIFETIME_S = 3600
"""How long a signed download URL stays valid."""

_TYPES = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}
_SIDECAR = SIDECAR
_Model = TypeVar("_Model", bound=pydantic.BaseModel)
Handler = Callable[[Request], Awaitable[Response]]
Parse = Callable[[Request, type[_Model]], Awaitable[_Model]]
ReadJson = Callable[[Request], Awaitable[object]]


def _iso(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).isoformat()


class CheckpointIndex:
    """The data directory's checkpoints as the hosted API describes them."""

    def __init__(self, engine: Engine, key: bytes) -> None:
        self.engine = engine
        self.key = key
        self.base = engine.store.root / "checkpoints"

    def directory(self, run_id: str, kind: str, name: str) -> Path:
        if kind not in _TYPES or not all(_safe(p) for p in (run_id, name)):
            raise RequestError(
                400,
                f"tinker://{run_id}/{kind}/{name} is not a checkpoint path: expected "
                "tinker://<run_id>/{weights|sampler_weights|external_weights}/<name>",
            )
        directory = self.base / run_id / kind / name
        if not directory.is_dir():
            raise RequestError(404, f"no checkpoint tinker://{run_id}/{kind}/{name} on this server")
        return directory

    def sidecar(self, directory: Path) -> dict[str, Any]:
        return read_sidecar(directory)

    def write_sidecar(self, directory: Path, **fields: Any) -> None:
        write_sidecar(directory, **fields)

    def entry(self, run_id: str, kind: str, directory: Path) -> dict[str, Any]:
        side = self.sidecar(directory)
        expires = side.get("expires_at")
        return {
            "checkpoint_id": f"{kind}/{directory.name}",
            "checkpoint_type": _TYPES[kind],
            "time": _iso(directory.stat().st_mtime),
            "tinker_path": f"tinker://{run_id}/{kind}/{directory.name}",
            "size_bytes": directory_size(directory),
            "public": False,
            "expires_at": None if expires is None else _iso(float(expires)),
            "user_metadata": side.get("user_metadata"),
            "training_run_id": run_id,
        }

    def run_id(self, name: str) -> str:
        """The run id that ``name`` stands for: a run id, or a training client's model id
        (``<session>:train:<n>``, recorded in its run's ``tinker.json``)."""
        if not _safe(name) or (self.base / name).is_dir() or not self.base.is_dir():
            return name
        for run_dir in sorted(self.base.iterdir()):
            if run_dir.is_dir() and self.sidecar(run_dir).get("model_id") == name:
                return run_dir.name
        return name

    def entries(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """Every checkpoint (of ``run_id``: a run id or a model id), newest first; expired ones
        are removed first."""
        out: list[tuple[float, dict[str, Any]]] = []
        if not self.base.is_dir():
            return []
        now = time.time()
        run_id = None if run_id is None else self.run_id(run_id)
        for run_dir in sorted(self.base.iterdir()):
            if not run_dir.is_dir() or (run_id is not None and run_dir.name != run_id):
                continue
            for kind in _TYPES:
                kind_dir = run_dir / kind
                for ckpt in sorted(kind_dir.iterdir()) if kind_dir.is_dir() else []:
                    if not ckpt.is_dir() or ckpt.name.startswith("."):
                        continue
                    expires = self.sidecar(ckpt).get("expires_at")
                    if expires is not None and float(expires) < now:
                        self.remove(run_dir.name, kind, ckpt.name)
                        continue
                    out.append((ckpt.stat().st_mtime, self.entry(run_dir.name, kind, ckpt)))
        out.sort(key=lambda pair: (pair[0], pair[1]["tinker_path"]), reverse=True)
        return [entry for _, entry in out]

    def remove(self, run_id: str, kind: str, name: str) -> None:
        directory = self.directory(run_id, kind, name)
        if kind == "external_weights":
            aside = directory.with_name(f".removing-{name}-{uuid.uuid4().hex[:8]}")
            directory.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            remove_checkpoint(self.engine.store, f"{SCHEME}{run_id}/{kind}/{name}")

    def weights_info(self, run_id: str, kind: str, name: str) -> dict[str, Any]:
        directory = self.directory(run_id, kind, name)
        side = self.sidecar(directory)
        if kind == "external_weights":
            return {
                "base_model": side.get("base_model", ""),
                "is_lora": side.get("lora_rank") is not None,
                "lora_rank": side.get("lora_rank"),
            }
        try:
            meta = self.engine.store.read_meta(f"{SCHEME}{run_id}/{kind}/{name}")
        except LocalEngineError as exc:
            raise RequestError(400, str(exc).replace(SCHEME, "tinker://")) from exc
        return {
            "base_model": meta.base_model,
            "is_lora": meta.lora is not None,
            "lora_rank": None if meta.lora is None else meta.lora.rank,
        }

    def training_run(self, run_id: str) -> dict[str, Any]:
        run_id = self.run_id(run_id)
        entries = self.entries(run_id)
        if not entries:
            raise RequestError(404, f"no training run {run_id!r} with checkpoints on this server")
        newest = entries[0]
        kind, name = newest["checkpoint_id"].split("/")
        info = self.weights_info(run_id, kind, name)
        by_type = {e["checkpoint_type"]: e for e in reversed(entries)}  # newest wins
        return {
            "training_run_id": run_id,
            "base_model": info["base_model"],
            "model_owner": "tempering-serve",
            "is_lora": info["is_lora"],
            "lora_rank": info["lora_rank"],
            "last_request_time": newest["time"],
            "last_checkpoint": by_type.get("training"),
            "last_sampler_checkpoint": by_type.get("sampler"),
            "user_metadata": self.engine.store.run_annotations(run_id).get("user_metadata"),
        }

    # ---- signed downloads ------------------------------------------------------------------------

    def signature(self, relative: str, expires: int) -> str:
        return hmac.new(self.key, f"{relative}:{expires}".encode(), hashlib.sha256).hexdigest()


def _safe(part: str) -> bool:
    return bool(part) and part not in (".", "..") and "/" not in part and "\\" not in part


def _paging(request: Request, default_limit: int) -> tuple[int, int]:
    try:
        limit = int(request.query_params.get("limit", default_limit))
        offset = int(request.query_params.get("offset", 0))
    except ValueError as exc:
        raise RequestError(400, f"limit and offset are integers ({exc})") from exc
    if limit < 1 or offset < 0:
        raise RequestError(400, f"limit must be >= 1 and offset >= 0, got {limit} and {offset}")
    return limit, offset


def save_external_job(
    engine: Engine, name: str, expires_at: float | None
) -> Callable[[LocalTrainingClient], Payload]:
    """The ``save_weights_external`` job, run on the model's queue in ``seq_id`` order: the
    current weights saved for sampling under a scratch name, exported as a PEFT adapter into
    ``external_weights/<name>``, and the scratch checkpoint removed."""

    def job(trainer: LocalTrainingClient) -> Payload:
        store = engine.store
        run_id = trainer.model_id
        target = store.root / "checkpoints" / run_id / "external_weights" / name
        if target.exists():
            raise ExportError(
                f"tinker://{run_id}/external_weights/{name} exists; choose another name (or delete it first)"
            )
        scratch_name = f"external-scratch-{uuid.uuid4().hex[:12]}"
        saved = trainer.save_weights_for_sampler(scratch_name).result().path
        try:
            out = export_checkpoint(saved, target, adapter=trainer.spec.lora is not None, store=store)
        finally:
            remove_checkpoint(store, saved)
        lora = trainer.spec.lora
        sidecar: dict[str, Any] = {
            "base_model": out.base_model,
            "lora_rank": None if lora is None else lora.rank,
        }
        if expires_at is not None:
            sidecar["expires_at"] = expires_at
        (target / _SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n", encoding="utf-8")
        path = f"tinker://{run_id}/external_weights/{name}"
        return ("json", {"path": path, "size_bytes": directory_size(target), "type": "save_weights_external"})

    return job


def _copy_checkpoint(source: Path, target: Path, sidecar: dict[str, Any]) -> None:
    """``source``'s files into a new checkpoint directory ``target`` (hard links where possible:
    a checkpoint's files are never rewritten in place), with a fresh ``tinker.json``."""
    with staged_dir(target, prefix=f".{target.name}-") as scratch:
        for f in source.iterdir():
            if not f.is_file() or f.name == SIDECAR or f.name.startswith("."):
                continue
            try:
                os.link(f, scratch / f.name)
            except OSError:  # another filesystem, or no hard links: copy
                shutil.copy2(f, scratch / f.name)
        write_sidecar(scratch, **sidecar)


def checkpoint_routes(
    engine: Engine, parse: Parse[Any], read_json: ReadJson, api_key: str
) -> tuple[list[tuple[str, Handler, list[str]]], list[tuple[str, Handler, list[str]]]]:
    """The routes (those that need the API key, and the signed-URL file route that does not).

    ``parse`` and ``read_json`` read a request's JSON body as the app does (size and nesting
    limits, a 400 for a malformed one)."""
    index = CheckpointIndex(engine, api_key.encode())

    def path_parts(request: Request) -> tuple[str, str, str]:
        p = request.path_params
        return str(p["run_id"]), str(p["kind"]), str(p["name"])

    async def list_user_checkpoints(request: Request) -> Response:
        limit, offset = _paging(request, 100)
        entries = index.entries()
        cursor = {"offset": offset, "limit": limit, "total_count": len(entries)}
        return JSONResponse({"checkpoints": entries[offset : offset + limit], "cursor": cursor})

    async def list_run_checkpoints(request: Request) -> Response:
        return JSONResponse({"checkpoints": index.entries(request.path_params["run_id"]), "cursor": None})

    async def list_training_runs(request: Request) -> Response:
        limit, offset = _paging(request, 20)
        run_ids = sorted({e["training_run_id"] for e in index.entries()})
        runs = [index.training_run(r) for r in run_ids[offset : offset + limit]]
        cursor = {"offset": offset, "limit": limit, "total_count": len(run_ids)}
        return JSONResponse({"training_runs": runs, "cursor": cursor})

    async def get_training_run(request: Request) -> Response:
        return JSONResponse(index.training_run(request.path_params["run_id"]))

    async def weights_info(request: Request) -> Response:
        raw = await read_json(request)
        tinker_path = cast("dict[str, object]", raw).get("tinker_path") if isinstance(raw, dict) else None
        if not isinstance(tinker_path, str):
            raise RequestError(400, "weights_info: give tinker_path")
        try:
            parsed = ttypes.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
        except ValueError as exc:
            raise RequestError(400, f"weights_info: {exc}") from exc
        kind, name = parsed.checkpoint_id.split("/")
        return JSONResponse(index.weights_info(parsed.training_run_id, kind, name))

    async def delete_checkpoint(request: Request) -> Response:
        index.remove(*path_parts(request))
        return Response(status_code=204)

    async def set_ttl(request: Request) -> Response:
        directory = index.directory(*path_parts(request))
        raw = await read_json(request)
        ttl = cast("dict[str, object]", raw).get("ttl_seconds") if isinstance(raw, dict) else None
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1):
            raise RequestError(400, f"ttl_seconds must be a positive integer or null, got {ttl!r}")
        index.write_sidecar(directory, expires_at=None if ttl is None else time.time() + ttl)
        return Response(status_code=204)

    async def external_urls(request: Request) -> Response:
        run_id, kind, name = path_parts(request)
        if kind != "external_weights":
            raise RequestError(
                400, "external_weights_urls: only external weights (save_weights_external) are downloadable"
            )
        directory = index.directory(run_id, kind, name)
        expires = int(time.time()) + URL_LIFETIME_S
        base = str(request.base_url).rstrip("/")
        urls: dict[str, str] = {}
        for f in sorted(directory.iterdir()):
            if f.is_file() and f.name != _SIDECAR and not f.name.startswith("."):
                relative = f"{run_id}/{kind}/{name}/{f.name}"
                sig = index.signature(relative, expires)
                urls[f.name] = f"{base}/api/v1/files/{relative}?expires={expires}&signature={sig}"
        return JSONResponse({"urls": urls, "expires": _iso(expires)})

    async def save_weights_external(request: Request) -> Response:
        req = await parse(request, ttypes.SaveWeightsExternalRequest)
        with engine.refusals_consume(req.model_id, req.seq_id):
            if req.age_encryption_recipients:
                raise RequestError(
                    400, "save_weights_external: encryption is not supported by the local server"
                )
            if not _safe(req.path) or req.path.startswith("."):
                raise RequestError(400, f"save_weights_external: {req.path!r} is not a checkpoint name")
            job = save_external_job(engine, req.path, check_ttl("save_weights_external", req.ttl_seconds))
            request_id = engine.submit_ordered(req.model_id, req.seq_id, job)
        return JSONResponse({"request_id": request_id, "model_id": req.model_id})

    copies: OrderedDict[str, str] = OrderedDict()
    """``X-Idempotency-Key`` and request -> the path its copy made (a retry gets the same copy)."""

    async def copy_weights(request: Request) -> Response:
        req = await parse(request, ttypes.CopyWeightsRequest)
        key = request.headers.get("x-idempotency-key")
        if key:  # the same operation: the same key and the same request
            key = f"{key} {req.model_dump_json()}"
        if key and key in copies:
            return JSONResponse({"tinker_path": copies[key]})
        slot = None
        if req.session_id is not None or req.model_seq_id is not None:
            if req.session_id is None or req.model_seq_id is None:
                raise RequestError(400, "copy_weights: give session_id together with model_seq_id")
            engine.open_session(req.session_id)
            slot = f"{req.session_id}:train:{req.model_seq_id}"
            if slot in engine.models:
                raise RequestError(400, f"copy_weights: slot {req.model_seq_id} of the session holds a model")
        elif req.destination_project_id is None:
            raise RequestError(
                400, "copy_weights: give destination_project_id, or session_id and model_seq_id"
            )
        expires_at = check_ttl("copy_weights", req.ttl_seconds)
        try:
            parsed = ttypes.ParsedCheckpointTinkerPath.from_tinker_path(req.source_path)
        except ValueError as exc:
            raise RequestError(400, f"copy_weights: {exc}") from exc
        kind, name = parsed.checkpoint_id.split("/")
        if kind == "external_weights":
            raise RequestError(
                400, "copy_weights: copies weights and sampler_weights checkpoints, not external exports"
            )
        source = index.directory(parsed.training_run_id, kind, name)
        run_id = engine.store.new_run_id()
        target = index.base / run_id / kind / name
        fields: dict[str, Any] = {
            "expires_at": expires_at,
            "user_metadata": index.sidecar(source).get("user_metadata"),
            "copied_from": req.source_path,
            "project_id": req.destination_project_id,
        }
        await asyncio.to_thread(_copy_checkpoint, source, target, fields)
        path = f"tinker://{run_id}/{kind}/{name}"
        if slot is not None:  # the copy's run answers to the slot's model id too
            engine.store.annotate_run(run_id, model_id=slot)
            engine.session_models.setdefault(req.session_id or "", []).append(slot)
        if key:
            remember(copies, key, path)
        return JSONResponse({"tinker_path": path})

    async def download(request: Request) -> Response:
        run_id, kind, name = path_parts(request)
        filename = str(request.path_params["filename"])
        try:
            expires = int(request.query_params.get("expires", "0"))
        except ValueError:
            expires = 0
        relative = f"{run_id}/{kind}/{name}/{filename}"
        given = request.query_params.get("signature", "")
        if not hmac.compare_digest(given, index.signature(relative, expires)) or expires < time.time():
            return JSONResponse({"detail": "invalid or expired download URL; ask for new ones"}, 403)
        if kind != "external_weights" or not _safe(filename) or filename == _SIDECAR:
            return JSONResponse({"detail": f"no file {relative}"}, 404)
        try:
            file = index.directory(run_id, kind, name) / filename
        except RequestError as exc:
            return JSONResponse({"detail": exc.message}, exc.status)
        if not file.is_file():
            return JSONResponse({"detail": f"no file {relative}"}, 404)
        return FileResponse(file, media_type="application/octet-stream")

    ckpt = "/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}"
    keyed: list[tuple[str, Handler, list[str]]] = [
        ("/api/v1/checkpoints", list_user_checkpoints, ["GET"]),
        ("/api/v1/training_runs", list_training_runs, ["GET"]),
        ("/api/v1/training_runs/{run_id}", get_training_run, ["GET"]),
        ("/api/v1/training_runs/{run_id}/checkpoints", list_run_checkpoints, ["GET"]),
        ("/api/v1/weights_info", weights_info, ["POST"]),
        (ckpt, delete_checkpoint, ["DELETE"]),
        (ckpt + "/ttl", set_ttl, ["PUT"]),
        (ckpt + "/external_weights_urls", external_urls, ["GET"]),
        ("/api/v1/save_weights_external", save_weights_external, ["POST"]),
        ("/api/v1/copy_weights", copy_weights, ["POST"]),
    ]
    public: list[tuple[str, Handler, list[str]]] = [
        ("/api/v1/files/{run_id}/{kind}/{name}/{filename}", download, ["GET"]),
    ]
    return keyed, public
