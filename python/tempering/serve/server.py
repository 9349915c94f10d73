"""Running the server: ``tempering serve`` checks its options, binds a loopback port, prints where
it listens once it accepts requests, and stops cleanly on SIGTERM or Ctrl-C (uvicorn's own signal
handling).

Every option is checked before the server binds its port or creates its data directory; a bad
one ends it with ``error: --FLAG VALUE ...`` on stderr (what to give instead) and exit status 2.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import signal
import socket
import sys
from types import FrameType

import uvicorn
from uvicorn.config import LOG_LEVELS

from tempering.fs import DirLock, DirLockedError, describe_os_error
from tempering.local.model import resolve_placement
from tempering.serve.app import DEFAULT_MAX_REQUEST_BYTES, build_app
from tempering.serve.engine import DEFAULT_SESSION_TTL_S, Engine
from tempering.serve.protocol import DEFAULT_READ_TIMEOUT_S, timed_protocol

__all__ = ["api_key_problem", "generate_api_key", "option_problems", "serve"]

_MB = 1024 * 1024
_SHUTDOWN_GRACE_S = 3
"""On SIGTERM, requests still open after this long (long polls) are dropped."""


_KEY_PREFIX = "tml-"
_SDK_HEARTBEAT_S = 10.0
"""The tinker SDK sends a session heartbeat this often while its client lives."""
_MIN_SAFE_TTL_S = 3 * _SDK_HEARTBEAT_S


class _TerminatedError(Exception):
    """Raised by our SIGTERM handler once uvicorn has shut down and passes the signal on."""


def _on_sigterm(_sig: int, _frame: FrameType | None) -> None:
    raise _TerminatedError


def api_key_problem(api_key: str) -> str | None:
    """Why ``api_key`` can't protect a server (None when it can).

    An empty key would let any client in, and the SDK refuses keys without the ``tml-`` prefix,
    so a server started with one could serve nobody (or, worse, anybody)."""
    if not api_key.strip():
        return "is empty: it would let any client in (omit --api-key to have one generated)"
    if not api_key.startswith(_KEY_PREFIX) or len(api_key) == len(_KEY_PREFIX):
        return (
            f"{api_key!r} is refused: the tinker SDK only sends keys that start with {_KEY_PREFIX!r} "
            "and go on after it (e.g. 'tml-local'; omit --api-key to have one generated)"
        )
    return None


def option_problems(
    *,
    port: int,
    max_request_mb: float,
    log_level: str,
    session_ttl_s: float,
    read_timeout_s: float,
    environ: dict[str, str] | None = None,
) -> list[str]:
    """What is wrong with ``tempering serve``'s options, one line each naming the flag, the value
    and what to give instead (empty when nothing is). ``environ``: the environment variables the
    server reads (default ``os.environ``)."""
    env = dict(os.environ) if environ is None else environ
    problems: list[str] = []
    if not 0 <= port <= 65535:
        problems.append(f"--port {port} is not a TCP port: give 1-65535 (or 0 to pick a free one)")
    if not (math.isfinite(max_request_mb) and max_request_mb > 0):  # NaN fails both
        problems.append(
            f"--max-request-mb {max_request_mb:g} is not a size: give a positive number of megabytes "
            "(default 256; the largest request body the server accepts)"
        )
    elif int(max_request_mb * _MB) < 1:
        problems.append(f"--max-request-mb {max_request_mb:g} is under one byte: give a positive size in MB")
    if log_level.lower() not in LOG_LEVELS:
        problems.append(f"--log-level {log_level!r} is not a level: give one of {', '.join(LOG_LEVELS)}")
    if not session_ttl_s >= 0:  # NaN too
        problems.append(f"--session-ttl-s {session_ttl_s:g} must be >= 0 seconds (0: never expire)")
    if not (math.isfinite(read_timeout_s) and read_timeout_s > 0):
        problems.append(
            f"--read-timeout {read_timeout_s:g} is not a timeout: give a positive number of seconds "
            f"(default {DEFAULT_READ_TIMEOUT_S:g}; how long a request's headers, or a pause in its "
            "body, may take)"
        )
    for name in ("TEMPERING_NUM_THREADS", "TEMPERING_SERVE_RESIDENT_SAMPLERS"):
        value = env.get(name, "")
        if value and not (value.strip().isdigit() and int(value) >= 1):
            problems.append(f"${name}={value!r} is not a count: give a whole number >= 1, or unset it")
    return problems


def generate_api_key() -> str:
    """A fresh key in the shape the SDK accepts (it refuses keys without the ``tml-`` prefix)."""
    return f"tml-local-{secrets.token_urlsafe(24)}"


def serve(
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    device: str | None = None,
    dtype: str | None = None,
    max_request_mb: float = DEFAULT_MAX_REQUEST_BYTES / _MB,
    log_level: str = "warning",
    session_ttl_s: float = DEFAULT_SESSION_TTL_S,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
) -> int:
    """Serve until SIGTERM or Ctrl-C; returns the exit status (2 for a refused option, before
    anything is bound or written: :func:`option_problems`).

    ``api_key``: the key clients must send (generated and printed when None; otherwise it must
    start with ``tml-`` and be longer than that). ``data_dir``: where checkpoints live (default
    ``$TEMPERING_HOME`` or ``~/.cache/tempering``). ``port`` 0 picks a free port; the line
    ``listening on http://HOST:PORT`` names it. ``session_ttl_s``: a session (an SDK client)
    that sends nothing, not even a heartbeat, for this long is finished and its models released
    (0: never). ``read_timeout_s``: a request's headers must arrive within this many seconds,
    and its body may pause no longer between chunks (:mod:`tempering.serve.protocol`).
    """
    problems = option_problems(
        port=port,
        max_request_mb=max_request_mb,
        log_level=log_level,
        session_ttl_s=session_ttl_s,
        read_timeout_s=read_timeout_s,
    )
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 2
    if api_key is None:
        api_key = generate_api_key()
        print(f"API key (generated): {api_key}", flush=True)
    problem = api_key_problem(api_key)
    if problem is not None:
        print(f"error: --api-key {problem}", file=sys.stderr)
        return 2
    if 0 < session_ttl_s < _MIN_SAFE_TTL_S:
        print(
            f"warning: --session-ttl-s {session_ttl_s:g} is short: the SDK heartbeats every "
            f"{_SDK_HEARTBEAT_S:.0f} s, so an idle client that is still running may lose its session",
            file=sys.stderr,
        )
    try:
        resolve_placement(device, dtype)
    except ValueError as exc:
        print(f"error: --device/--dtype (or $TEMPERING_DEVICE/$TEMPERING_DTYPE): {exc}", file=sys.stderr)
        return 2
    level = LOG_LEVELS[log_level.lower()]
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        sock = listen_socket(host, port)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    root = data_dir if data_dir is not None else _default_data_dir()
    try:  # one server writes a data dir at a time: a second one is refused, naming the first
        lock = DirLock.acquire(root, what="data directory")
    except (DirLockedError, OSError) as exc:
        sock.close()
        text = describe_os_error(exc) if isinstance(exc, OSError) and exc.strerror is None else str(exc)
        print(f"error: --data-dir {root}: {text}", file=sys.stderr)
        return 2
    try:
        engine = Engine(root, device=device, dtype=dtype)
    except OSError as exc:
        sock.close()
        lock.release()
        print(f"error: --data-dir {root}: cannot use it as the data directory ({exc})", file=sys.stderr)
        return 2
    max_request_bytes = int(max_request_mb * _MB)
    app = build_app(engine, api_key, max_request_bytes=max_request_bytes, session_ttl_s=session_ttl_s or None)
    bound_port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app,
        http=timed_protocol(read_timeout_s),
        log_level=level,
        access_log=False,
        timeout_graceful_shutdown=_SHUTDOWN_GRACE_S,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    shown_host = f"[{host}]" if ":" in host else host
    # uvicorn handles SIGTERM and Ctrl-C itself (a graceful shutdown), then re-raises the signal
    # to the handler that was there before it: make that handler end the process cleanly.
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        asyncio.run(_run(server, sock, f"http://{shown_host}:{bound_port}"))
    except (KeyboardInterrupt, _TerminatedError):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        engine.close()
        sock.close()
        lock.release()
    print("stopped", flush=True)
    return 0


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` whose accepted connections have Nagle off.

    ``proto=IPPROTO_TCP`` matters: asyncio sets ``TCP_NODELAY`` only on sockets whose ``proto``
    says TCP, and accepted sockets copy it from the listening one (``socket.socket(family,
    SOCK_STREAM)`` leaves it 0). With Nagle on, a response written as headers then body waits
    for the client's delayed ACK (about 40 ms on Linux) before the body leaves: that was most of
    the wire path's overhead per training step. ``TCP_NODELAY`` on the listener as well, which
    Linux passes on to accepted sockets.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def _run(server: uvicorn.Server, sock: socket.socket, url: str) -> None:
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.02)
    if server.started:
        print(f"listening on {url}", flush=True)
    await task


def _default_data_dir() -> str:
    from tempering.local.checkpoints import default_root

    return str(default_root())
