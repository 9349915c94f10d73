"""The HTTP surface: the ``/api/v1`` routes the official ``tinker`` SDK calls, on Starlette.

Conventions the SDK relies on (measured against tinker 0.38):

- Work is asynchronous: a training or sampling call answers ``{"request_id": ...}`` at once and
  the SDK polls ``/retrieve_future``; a poll waits up to :data:`LONG_POLL_S` for the result and
  then answers ``{"type": "try_again"}`` (the SDK's own timeout per poll is 45 s).
- A failed request's poll answers ``{"error": message, "category": "user" | "server"}``, which
  the SDK raises as ``tinker.RequestFailedError`` at once. A request refused before it is
  queued (bad key, unknown model or checkpoint, malformed body, unsupported option) gets a 4xx
  with a JSON body ``{"detail": message}``: never a 5xx, 408, 409 or 429 (the SDK retries those
  for minutes) and never a 400 with an empty body (the SDK takes that for a proxy glitch).
- JSON bodies nest at most ``tempering.data.jsontext.MAX_JSON_DEPTH`` deep (a 400 past it); no
  answer names a path on the server (:mod:`tempering.serve.private`). A request whose headers or
  body stall past ``--read-timeout`` gets a 408 from the connection itself
  (:mod:`tempering.serve.protocol`), and a client gone mid-body is logged at INFO.
- ``forward_backward`` bodies arrive as protobuf, and its results and ``asample``'s go back as
  protobuf; everything else is JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from concurrent.futures import Future as ConcurrentFuture
from typing import Any, TypeVar, cast

import pydantic
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tinker import types as ttypes

from tempering.data.jsontext import JSONNestingError, loads_bounded
from tempering.local.checkpoints import default_root
from tempering.serve.checkpoints import checkpoint_routes
from tempering.serve.engine import (
    DEFAULT_SESSION_TTL_S,
    Engine,
    Payload,
    RequestError,
    error_category,
)
from tempering.serve.private import PathScrubber
from tempering.serve.wire import WireError, decode_forward_backward

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "LONG_POLL_S", "build_app"]

log = logging.getLogger("tempering.serve")

LONG_POLL_S = 30.0
"""How long one ``/retrieve_future`` poll waits for the result before saying "try again"."""

DEFAULT_MAX_REQUEST_BYTES = 256 * 1024 * 1024
"""Request bodies larger than this are refused with a 413."""

_PROTO = "application/x-protobuf"
_Model = TypeVar("_Model", bound=pydantic.BaseModel)
Handler = Callable[[Request], Awaitable[Response]]
_Sequenced = TypeVar(
    "_Sequenced",
    ttypes.OptimStepRequest,
    ttypes.SaveWeightsRequest,
    ttypes.SaveWeightsForSamplerRequest,
)
"""The JSON training requests that are only queued in their model's sequence."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def build_app(
    engine: Engine,
    api_key: str,
    *,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    session_ttl_s: float | None = DEFAULT_SESSION_TTL_S,
) -> Starlette:
    """The Starlette application serving ``engine`` to clients that present ``api_key``.

    ``session_ttl_s``: a session that sends nothing for this long expires (None: never).
    """
    if not api_key:
        raise ValueError("api_key is empty: the server would accept any client")
    expected_key = api_key.encode()
    # every message a client gets goes through it: no server paths (tempering.serve.private)
    scrub = PathScrubber(engine.store.root, home=default_root())

    def check_key(request: Request) -> None:
        given = request.headers.get("x-api-key", "").encode()
        if not hmac.compare_digest(given, expected_key):
            raise RequestError(401, "invalid API key (send the key the server was started with as X-API-Key)")

    async def body(request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_request_bytes:
            raise RequestError(
                413, f"request body of {length} bytes exceeds the limit of {max_request_bytes}"
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_request_bytes:
                raise RequestError(413, f"request body exceeds the limit of {max_request_bytes} bytes")
            chunks.append(chunk)
        if request.headers.get("content-encoding", "identity") not in ("identity", ""):
            raise RequestError(
                400, "compressed request bodies are not supported (proto_compress_fwdbwd is off)"
            )
        return b"".join(chunks)

    async def read_json(request: Request) -> object:
        """The request's JSON body (``{}`` when empty), nested at most ``MAX_JSON_DEPTH`` deep."""
        raw = await body(request)
        try:
            return loads_bounded(raw or b"{}")
        except JSONNestingError as exc:
            raise RequestError(
                400,
                f"{request.url.path}: the JSON body nests deeper than {exc.limit} levels (arrays and "
                f"objects) at byte {exc.position + 1}; send a flatter body",
            ) from exc
        except (ValueError, RecursionError) as exc:  # RecursionError: never past the depth check
            raise RequestError(400, f"{request.url.path}: the body is not JSON ({exc})") from exc

    async def parse(request: Request, model: type[_Model]) -> _Model:
        obj = await read_json(request)
        try:
            return model.model_validate(obj)
        except pydantic.ValidationError as exc:
            if isinstance(obj, dict):  # a training request's number is used up all the same
                fields = cast("dict[str, object]", obj)
                model_id, seq_id = fields.get("model_id"), fields.get("seq_id")
                if isinstance(model_id, str) and isinstance(seq_id, int):
                    engine.refused(model_id, seq_id)
            raise RequestError(400, f"{request.url.path}: {_short(exc)}") from exc

    def endpoint(fn: Handler, *, keyed: bool = True) -> Handler:
        """Authenticate (unless not ``keyed``), and turn refusals into 4xx JSON answers that
        name no server path; a client gone mid-body is logged at INFO."""

        async def wrapped(request: Request) -> Response:
            try:
                if keyed:
                    check_key(request)
                return await fn(request)
            except RequestError as exc:
                return _error(exc.status, scrub(exc.message))
            except WireError as exc:
                return _error(400, scrub(str(exc)))
            except ClientDisconnect:
                # the client went away (or --read-timeout closed it): nothing to answer, no traceback
                where = f"{request.client.host}:{request.client.port}" if request.client else "a client"
                log.info(
                    "%s: %s %s: the client disconnected before its request body was complete",
                    where,
                    request.method,
                    request.url.path,
                )
                return _error(400, "the request body was not complete")
            except Exception:
                log.exception("%s failed", request.url.path)
                return _error(500, f"{request.url.path}: internal error (see the server's log)")

        return wrapped

    def future(request_id: str, **extra: Any) -> JSONResponse:
        return JSONResponse({"request_id": request_id, **extra})

    # ---- session ------------------------------------------------------------------------------

    async def client_config(request: Request) -> Response:
        await body(request)
        # Every optional feature off: plain API keys, uncompressed protobuf, per-request polling,
        # client-side custom losses, httpx's own transport.
        return JSONResponse(
            {
                "pjwt_auth_enabled": False,
                "proto_compress_fwdbwd": False,
                "sample_use_retrieve_futures": False,
                "custom_loss_server_side": False,
                "sample_join_sampling_session": False,
                "use_pyqwest_transport": False,
            }
        )

    async def dynamic_config(request: Request) -> Response:
        await body(request)
        return JSONResponse({"sample_cancel_enabled": False})

    async def create_session(request: Request) -> Response:
        req = await parse(request, ttypes.CreateSessionRequest)
        return JSONResponse({"type": "create_session", "session_id": engine.create_session(req)})

    async def get_session(request: Request) -> Response:
        return JSONResponse(engine.get_session(request.path_params["session_id"]))

    async def heartbeat(request: Request) -> Response:
        req = await parse(request, ttypes.SessionHeartbeatRequest)
        engine.open_session(req.session_id)
        return JSONResponse({"type": "session_heartbeat"})

    async def telemetry(request: Request) -> Response:
        await body(request)  # accepted and dropped: nothing leaves this machine
        return JSONResponse({"status": "accepted"})

    async def finish(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        reason, detail = _finish_reason(await body(request))
        engine.finish_session(session_id)
        # a run that ended in an error is worth a line in the server's log; a success is routine
        level = logging.INFO if reason in ("success", "") else logging.WARNING
        log.log(
            level, "session %s finished by its client: %s%s", session_id, reason or "no reason given", detail
        )
        return JSONResponse({})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", **engine.counts()})

    async def capabilities(request: Request) -> Response:
        return JSONResponse({"supported_models": []})

    async def cancel_future(request: Request) -> Response:
        await body(request)  # sample_cancel_enabled is off; accept and ignore
        return JSONResponse({})

    # ---- training -----------------------------------------------------------------------------

    async def create_model(request: Request) -> Response:
        req = await parse(request, ttypes.CreateModelRequest)
        return future(engine.create_model(req))

    async def get_info(request: Request) -> Response:
        req = await parse(request, ttypes.GetInfoRequest)
        return JSONResponse(await engine.get_info(req.model_id))

    def in_sequence(model_id: str, seq_id: int | None, start: Callable[[], str]) -> Response:
        """Queue a training request with :meth:`Engine.refusals_consume`: one refused here (4xx)
        still uses up its ``seq_id`` (see ``Engine.refused``)."""
        with engine.refusals_consume(model_id, seq_id):
            return future(start(), model_id=model_id)

    async def forward_backward(request: Request) -> Response:
        call = decode_forward_backward(await body(request))
        return in_sequence(call.model_id, call.seq_id, lambda: engine.forward_backward(call))

    def sequenced(request_type: type[_Sequenced], start: Callable[[_Sequenced], str]) -> Handler:
        """The handler of a JSON training request that ``start`` queues (in sequence)."""

        async def handler(request: Request) -> Response:
            req = await parse(request, request_type)
            return in_sequence(req.model_id, req.seq_id, lambda: start(req))

        return handler

    optim_step = sequenced(ttypes.OptimStepRequest, engine.optim_step)
    save_weights = sequenced(ttypes.SaveWeightsRequest, engine.save_state)
    save_weights_for_sampler = sequenced(
        ttypes.SaveWeightsForSamplerRequest, lambda r: engine.save_weights_for_sampler(r, kind=r.kind)
    )

    async def load_weights(request: Request) -> Response:
        req = await parse(request, ttypes.LoadWeightsRequest)
        if req.session_id is not None and req.model_seq_id is not None:
            return future(engine.create_model_from_state(req))
        if req.model_id is None:
            raise RequestError(400, "load_weights: give model_id, or session_id with model_seq_id")
        return in_sequence(req.model_id, req.seq_id, lambda: engine.load_state(req))

    # ---- sampling -----------------------------------------------------------------------------

    async def create_sampling_session(request: Request) -> Response:
        req = await parse(request, ttypes.CreateSamplingSessionRequest)
        sampler_id = engine.create_sampling_session(req)
        return JSONResponse({"type": "create_sampling_session", "sampling_session_id": sampler_id})

    async def get_sampler(request: Request) -> Response:
        sampler = engine.sampler(request.path_params["sampler_id"])
        return JSONResponse(
            {
                "sampler_id": sampler.sampler_id,
                "base_model": sampler.base_model,
                "model_path": sampler.model_path,
            }
        )

    async def asample(request: Request) -> Response:
        req = await parse(request, ttypes.SampleRequest)
        request_id, sequence_ids = engine.sample(req)
        return future(request_id, sample_sequence_ids=sequence_ids)

    # ---- futures ------------------------------------------------------------------------------

    async def retrieve_future(request: Request) -> Response:
        req = await parse(request, ttypes.FutureRetrieveRequest)
        result = engine.futures.get(req.request_id)
        if result is None:
            raise RequestError(404, f"unknown request id {req.request_id!r} (or a restarted server)")
        if not result.done():
            await _wait(result, LONG_POLL_S)
        if not result.done():
            return JSONResponse({"type": "try_again", "request_id": req.request_id, "queue_state": "active"})
        error = result.exception()
        if error is not None:
            return JSONResponse(
                {"error": scrub(f"{type(error).__name__}: {error}"), "category": error_category(error)}
            )
        payload: Payload = result.result()
        if payload[0] == "proto":
            return Response(payload[1], media_type=_PROTO)
        return JSONResponse(payload[1])

    routes: list[tuple[str, Handler, list[str]]] = [
        ("/api/v1/client/config", client_config, ["POST"]),
        ("/api/v1/client/dynamic_config", dynamic_config, ["POST"]),
        ("/api/v1/create_session", create_session, ["POST"]),
        ("/api/v1/session_heartbeat", heartbeat, ["POST"]),
        ("/api/v1/telemetry", telemetry, ["POST"]),
        ("/api/v1/sessions/{session_id}/finish", finish, ["POST"]),
        ("/api/v1/sessions/{session_id}", get_session, ["GET"]),
        ("/api/v1/healthz", healthz, ["GET"]),
        ("/api/v1/get_server_capabilities", capabilities, ["GET"]),
        ("/api/v1/cancel_future", cancel_future, ["POST"]),
        ("/api/v1/create_model", create_model, ["POST"]),
        ("/api/v1/get_info", get_info, ["POST"]),
        ("/api/v1/forward_backward", forward_backward, ["POST"]),
        ("/api/v1/optim_step", optim_step, ["POST"]),
        ("/api/v1/save_weights", save_weights, ["POST"]),
        ("/api/v1/save_weights_for_sampler", save_weights_for_sampler, ["POST"]),
        ("/api/v1/load_weights", load_weights, ["POST"]),
        ("/api/v1/create_sampling_session", create_sampling_session, ["POST"]),
        ("/api/v1/samplers/{sampler_id}", get_sampler, ["GET"]),
        ("/api/v1/asample", asample, ["POST"]),
        ("/api/v1/retrieve_future", retrieve_future, ["POST"]),
    ]
    keyed, public = checkpoint_routes(engine, parse, read_json, api_key)
    routes += keyed

    async def expire_sessions(ttl_s: float) -> None:
        while True:
            await asyncio.sleep(min(ttl_s / 2, 30.0))
            try:
                engine.expire_idle_sessions(ttl_s)
            except Exception:
                log.exception("expiring idle sessions failed")

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncGenerator[None]:
        engine.attach(asyncio.get_running_loop())
        sweeper = None if session_ttl_s is None else asyncio.create_task(expire_sessions(session_ttl_s))
        try:
            yield
        finally:
            if sweeper is not None:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, f"no route {request.method} {request.url.path}")

    return Starlette(
        routes=[Route(path, endpoint(fn), methods=methods) for path, fn, methods in routes]
        + [Route(path, endpoint(fn, keyed=False), methods=methods) for path, fn, methods in public],
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: not_found},
    )


async def _wait(result: ConcurrentFuture[Payload], timeout: float) -> None:
    """Wait for ``result`` up to ``timeout`` seconds without ever cancelling it."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()

    def wake(_: ConcurrentFuture[Payload]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone at shutdown
            loop.call_soon_threadsafe(ready.set)

    result.add_done_callback(wake)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ready.wait(), timeout)


def _finish_reason(raw: bytes) -> tuple[str, str]:
    """``(reason, ": detail")`` of a session-finish body (``{"reason": {"type": ...}, "detail":
    ...}``); empty strings where the body has none (an older SDK sends no body)."""
    try:
        obj: Any = loads_bounded(raw or b"{}")
    except (ValueError, RecursionError):
        return "", ""
    if not isinstance(obj, dict):
        return "", ""
    reason: Any = obj.get("reason")  # pyright: ignore[reportUnknownMemberType]
    kind: Any = reason.get("type") if isinstance(reason, dict) else None  # pyright: ignore[reportUnknownMemberType]
    detail: Any = obj.get("detail")  # pyright: ignore[reportUnknownMemberType]
    return (
        kind if isinstance(kind, str) else "",
        f": {detail}" if isinstance(detail, str) and detail else "",
    )


def _short(exc: pydantic.ValidationError) -> str:
    problems = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()[:3]]
    return "; ".join(problems)
