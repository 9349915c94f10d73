"""The engine's bookkeeping: request futures, training models in ``seq_id`` order, samplers.

:class:`~tempering.serve.engine.Engine` (whose docstring tells the threading and session rules)
keeps one :class:`TrainingModel` per training client and one :class:`Sampler` per sampling
session; every finished request's :data:`Payload` waits in the :class:`FutureTable` until the SDK
polls it. Everything here runs on the event loop thread.

Sequence numbers: the SDK numbers each training client's requests 1, 2, 3, ... (``seq_id``),
and may resend a request after a connection error. A request is executed once, in ``seq_id``
order: a resend gets the future id of the first copy, and a request that arrives ahead of a gap
waits for it (for at most :data:`GAP_TIMEOUT_S`, after which the waiting requests run in order
and a warning is logged: a request the SDK reserved but never sent must not hang the model).
A request refused with a 4xx before it is queued uses up its number all the same (the SDK never
resends it), so the requests behind it don't wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future as ConcurrentFuture
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, TypeVar

import tinker
from tinker import types as ttypes

from tempering.local.checkpoints import SCHEME
from tempering.local.errors import LocalEngineError
from tempering.local.futures import Worker
from tempering.local.training import LocalTrainingClient
from tempering.serve.samplers import SamplerRef
from tempering.serve.wire import WireError

__all__ = [
    "DEFAULT_SESSION_TTL_S",
    "GAP_TIMEOUT_S",
    "TINKER_SCHEME",
    "FutureTable",
    "Payload",
    "RequestError",
    "Sampler",
    "Sessions",
    "TrainingModel",
    "call_on_loop",
    "check_optimizer",
    "check_sample_request",
    "check_ttl",
    "error_category",
    "forward_outcome",
    "metadata_strings",
    "remember",
    "to_local_path",
    "to_tinker_path",
]

log = logging.getLogger("tempering.serve")

GAP_TIMEOUT_S = 10.0
"""How long a training request that arrived ahead of a missing ``seq_id`` waits for it."""

DEFAULT_SESSION_TTL_S = 600.0
"""A session that sends nothing (not even the SDK's heartbeat, every 10 s) for this long expires."""

_FUTURES_KEPT = 4096
"""Finished futures kept for polling (oldest dropped first); unfinished ones are always kept."""

_DEDUP_KEPT = 1024
"""Sequence numbers remembered per model or sampler for recognising resent requests."""

TINKER_SCHEME = "tinker://"

Payload: TypeAlias = tuple[Literal["json"], dict[str, object]] | tuple[Literal["proto"], bytes]
"""A finished request's result as it goes on the wire: a JSON object or protobuf bytes."""

_K = TypeVar("_K")
_S = TypeVar("_S")
_T = TypeVar("_T")


class RequestError(Exception):
    """A request the server refuses at once, answered with ``status`` and a JSON message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_category(exc: BaseException) -> Literal["user", "server"]:
    """Whether a failed request was the caller's mistake (bad data, unknown checkpoint, ...)."""
    user = (LocalEngineError, WireError, ValueError, TypeError, KeyError, FileNotFoundError)
    return "user" if isinstance(exc, user) else "server"


def to_local_path(path: str) -> str:
    """A ``tinker://`` path handed out by this server as the local store's ``tempering://`` path."""
    if path.startswith(TINKER_SCHEME):
        return SCHEME + path[len(TINKER_SCHEME) :]
    raise RequestError(400, f"{path!r}: checkpoint paths start with {TINKER_SCHEME}")


def to_tinker_path(path: str) -> str:
    return TINKER_SCHEME + path[len(SCHEME) :] if path.startswith(SCHEME) else path


def forward_outcome(
    source: ConcurrentFuture[_S], target: ConcurrentFuture[_T], convert: Callable[[_S], _T]
) -> None:
    """Copy ``source``'s outcome, through ``convert``, into ``target`` when it arrives (an error
    in ``convert`` fails ``target`` too)."""

    def done(f: ConcurrentFuture[_S]) -> None:
        error = f.exception()
        if error is not None:
            target.set_exception(error)
            return
        try:
            target.set_result(convert(f.result()))
        except Exception as exc:
            target.set_exception(exc)

    source.add_done_callback(done)


def call_on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    """Run ``fn`` on the event loop and wait for it (called from a worker thread), so that
    what it registers exists before the future that names it completes."""
    with contextlib.suppress(RuntimeError):  # no loop running on this thread
        if asyncio.get_running_loop() is loop:  # called on the loop itself: run it now
            fn()
            return
    done: ConcurrentFuture[None] = ConcurrentFuture()

    def run() -> None:
        try:
            fn()
            done.set_result(None)
        except BaseException as exc:
            done.set_exception(exc)

    loop.call_soon_threadsafe(run)
    done.result(timeout=30)


def check_sample_request(request: ttypes.SampleRequest) -> tinker.TensorData | None:
    """Refuse (400) the sampling options the local server does not implement; return the
    request's ``target_prompt_logprobs`` as a ``tinker.TensorData`` (checked by the sampler)."""
    if request.prompt_alt_tokens_k:
        raise RequestError(400, "asample: prompt_alt_tokens_k is not supported by the local server")
    if request.prompt_logprobs_last_n is not None:
        raise RequestError(400, "asample: prompt_logprobs_last_n is not supported by the local server")
    if request.record_stability_info:
        raise RequestError(
            400,
            "asample: record_stability_info (StableReinforce's recorded sampler state) is not "
            "implemented by the local server; create the sampling client without it",
        )
    target = request.target_prompt_logprobs
    if target is None:
        return None
    try:
        return tinker.TensorData(
            data=target.data,
            dtype=target.dtype,
            shape=target.shape,
            sparse_crow_indices=target.sparse_crow_indices,
            sparse_col_indices=target.sparse_col_indices,
        )
    except ValueError as exc:
        raise RequestError(400, f"asample: target_prompt_logprobs: {exc}") from exc


def check_optimizer(where: str, config: object) -> None:
    """Refuse (400) an optimizer other than Adam (a ``DimuonOptimizerConfig`` or
    ``DimuonParams``, or any other family), naming it."""
    if config is None or isinstance(config, ttypes.AdamOptimizerConfig | tinker.AdamParams):
        return
    family = getattr(config, "type", type(config).__name__)
    what = "DimuonOptimizerConfig / DimuonParams" if family == "dimuon" else repr(family)
    raise RequestError(
        400,
        f"{where}: the {family!s} optimizer ({what}) is not implemented by the local server; "
        "it trains with Adam (leave the optimizer unset, or use AdamParams)",
    )


def check_ttl(where: str, ttl_seconds: int | None) -> float | None:
    """The expiry time (``time.time()`` seconds) of a checkpoint saved now with ``ttl_seconds``
    (None: never expires); a TTL below 1 second is refused (400)."""
    if ttl_seconds is None:
        return None
    if ttl_seconds < 1:
        raise RequestError(
            400, f"{where}: ttl_seconds must be a positive number of seconds (or None), got {ttl_seconds}"
        )
    return time.time() + ttl_seconds


def metadata_strings(metadata: Mapping[str, Any] | None) -> dict[str, str] | None:
    """``user_metadata`` as the SDK's listings type it (``dict[str, str]``): strings stay, other
    JSON values are written as JSON."""
    if not metadata:
        return None
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}


class Sessions:
    """The SDK's sessions: open or finished, when each last sent anything, their metadata."""

    def __init__(self) -> None:
        self.state: dict[str, bool] = {}
        """Session id -> whether it is still open."""
        self.last_seen: dict[str, float] = {}
        """Open session id -> when (``time.monotonic()``) it last sent a request or heartbeat."""
        self.expired: dict[str, float] = {}
        """Session id -> the idle time after which it expired (for the refusals that follow)."""
        self.described: dict[str, tuple[dict[str, str] | None, str | None]] = {}
        """Session id -> its ``user_metadata`` and ``display_name`` (``create_session``)."""

    def create(self, request: ttypes.CreateSessionRequest) -> str:
        session_id = f"session-{uuid.uuid4().hex[:16]}"
        self.state[session_id] = True
        self.last_seen[session_id] = time.monotonic()
        self.described[session_id] = (metadata_strings(request.user_metadata), request.display_name)
        return session_id

    def touch(self, session_id: str) -> None:
        """Check that ``session_id`` exists and is not finished; it counts as activity."""
        state = self.state.get(session_id)
        if state is None:
            raise RequestError(404, f"unknown session {session_id!r}")
        if not state:
            raise RequestError(410, self.finished_message(session_id))
        self.last_seen[session_id] = time.monotonic()

    def finished_message(self, session_id: str) -> str:
        idle = self.expired.get(session_id)
        if idle is None:
            return f"session {session_id!r} has finished"
        return (
            f"session {session_id!r} expired after {idle:.0f} s without a request or heartbeat "
            "(tempering serve --session-ttl-s); create a new ServiceClient"
        )

    def finish(self, session_id: str) -> None:
        if session_id not in self.state:
            raise RequestError(404, f"unknown session {session_id!r}")
        self.state[session_id] = False
        self.last_seen.pop(session_id, None)

    def idle(self, ttl_s: float, now: float) -> list[str]:
        """The open sessions that have sent nothing for ``ttl_s`` seconds; each is marked expired."""
        idle = [s for s, seen in self.last_seen.items() if now - seen > ttl_s]
        for session_id in idle:
            self.expired[session_id] = now - self.last_seen[session_id]
        return idle


class FutureTable:
    """Request ids and the futures behind them, for ``/retrieve_future``."""

    def __init__(self) -> None:
        self._futures: OrderedDict[str, ConcurrentFuture[Payload]] = OrderedDict()
        self._ids = itertools.count(1)

    def add(self, future: ConcurrentFuture[Payload]) -> str:
        request_id = f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        self._futures[request_id] = future
        if len(self._futures) > _FUTURES_KEPT:
            for old in [k for k, f in self._futures.items() if f.done()][
                : len(self._futures) - _FUTURES_KEPT
            ]:
                del self._futures[old]
        return request_id

    def get(self, request_id: str) -> ConcurrentFuture[Payload] | None:
        return self._futures.get(request_id)


@dataclass
class TrainingModel:
    """One training client of the SDK: its ordered queue and its ``seq_id`` bookkeeping."""

    model_id: str
    session_id: str
    queue: Worker
    created: ConcurrentFuture[LocalTrainingClient]
    create_request_id: str = ""
    next_seq: int = 1
    seen: OrderedDict[int, str] = field(default_factory=lambda: OrderedDict[int, str]())
    waiting: dict[int, Callable[[], None]] = field(default_factory=lambda: dict[int, Callable[[], None]]())
    gap_timer: asyncio.TimerHandle | None = None

    def trainer(self) -> LocalTrainingClient:
        """The built client (call on the queue, after the creation job)."""
        return self.created.result()

    def in_order(self, seq_id: int, dispatch: Callable[[], None]) -> None:
        """Run ``dispatch`` now if ``seq_id`` is next (or late), else once the gap before it closes."""
        if seq_id > self.next_seq:
            self.waiting[seq_id] = dispatch
            if self.gap_timer is None:
                loop = asyncio.get_running_loop()
                self.gap_timer = loop.call_later(GAP_TIMEOUT_S, self._close_gap)
            return
        dispatch()
        if seq_id == self.next_seq:
            self.next_seq += 1
            self._drain()

    def _drain(self) -> None:
        while self.next_seq in self.waiting:
            self.waiting.pop(self.next_seq)()
            self.next_seq += 1
        if not self.waiting and self.gap_timer is not None:
            self.gap_timer.cancel()
            self.gap_timer = None

    def _close_gap(self) -> None:
        self.gap_timer = None
        if not self.waiting:
            return
        first = min(self.waiting)
        log.warning(
            "model %s: seq_id %d never arrived after %.0f s; running %d waiting request(s) in order",
            self.model_id,
            self.next_seq,
            GAP_TIMEOUT_S,
            len(self.waiting),
        )
        self.next_seq = first
        self._drain()
        if self.waiting:
            self.gap_timer = asyncio.get_running_loop().call_later(GAP_TIMEOUT_S, self._close_gap)


@dataclass
class Sampler:
    """One sampling session: the sampler weights it uses and what ``/samplers/{id}`` reports."""

    sampler_id: str
    session_id: str
    ref: SamplerRef
    """The weights it samples from (shared with other sessions where they are the same)."""
    base_model: str
    model_path: str | None
    seen: OrderedDict[int, tuple[str, list[str]]] = field(
        default_factory=lambda: OrderedDict[int, tuple[str, list[str]]]()
    )


def remember(seen: OrderedDict[_K, _T], key: _K, value: _T) -> None:
    seen[key] = value
    while len(seen) > _DEDUP_KEPT:
        seen.popitem(last=False)
