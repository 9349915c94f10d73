"""The viewer's Starlette app, its server, and the static page.

JSON endpoints (every one answers 200 or a 4xx with ``{"error": ...}``, never a 500)::

    GET /api/runs                                   name, path, config, checkpoints of each run
    GET /api/metrics?run=I                          the run's curves, grouped by prefix, downsampled
    GET /api/steps?run=I                            the steps with rollouts, of the run and its stages
    GET /api/rollouts?run=I&stage=N&step=S&group=G&sort=best|worst|order&tag=T&end_reason=E
    GET /api/compare?run=I[&before_stage=N&before=S&after_stage=N&after=S]
                                                    held-out answers of two evaluations (default:
                                                    the first and the last), side by side
"""

from __future__ import annotations

import errno
import json
import socket
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from tempering.view.compare import comparison, default_comparison
from tempering.view.data import (
    Run,
    find_runs,
    group_episodes,
    metric_series,
    rollout_page,
    rollout_steps,
    run_summary,
    step_episodes,
)
from tempering.view.page import page_html, plotly_js

__all__ = ["PortInUseError", "build_app", "check_port", "serve", "static_data", "write_static"]


class PortInUseError(OSError):
    """The port asked for is taken by another process."""


class _BadRequestError(ValueError):
    pass


def _int(request: Request, name: str, default: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        if default is None:
            raise _BadRequestError(f"missing query parameter {name!r}")
        return default
    try:
        return int(raw)
    except ValueError:
        raise _BadRequestError(f"query parameter {name!r} must be an integer, got {raw!r}") from None


def build_app(runs: Sequence[Run]) -> Starlette:
    """The viewer of ``runs`` (see :func:`tempering.view.data.find_runs`)."""

    def _run(request: Request) -> Run:
        i = _int(request, "run", 0)
        if not 0 <= i < len(runs):
            raise _BadRequestError(f"run {i} out of range: {len(runs)} run(s)")
        return runs[i]

    def _compare(r: Request) -> Any:
        run = _run(r)
        if "before" not in r.query_params and "after" not in r.query_params:
            return default_comparison(run)
        q = r.query_params
        return comparison(
            run, q.get("before_stage", ""), _int(r, "before"), q.get("after_stage", ""), _int(r, "after")
        )

    def endpoint(fn: Callable[[Request], Any]) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            try:
                return JSONResponse(fn(request))
            except _BadRequestError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            except (OSError, ValueError) as exc:  # a file vanished or changed while read
                return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=409)

        return handle

    async def index(_: Request) -> Response:
        return HTMLResponse(page_html(None))

    async def plotly(_: Request) -> Response:
        return Response(plotly_js(), media_type="application/javascript")

    routes = [
        Route("/", index),
        Route("/plotly.js", plotly),
        Route("/api/runs", endpoint(lambda _r: [run_summary(r) for r in runs])),
        Route("/api/metrics", endpoint(lambda r: metric_series(_run(r)))),
        Route("/api/steps", endpoint(lambda r: rollout_steps(_run(r)))),
        Route(
            "/api/rollouts",
            endpoint(
                lambda r: rollout_page(
                    _run(r),
                    _int(r, "step"),
                    stage=r.query_params.get("stage", ""),
                    group=_int(r, "group") if r.query_params.get("group") else None,
                    sort=r.query_params.get("sort", "best"),
                    tag=r.query_params.get("tag", ""),
                    end_reason=r.query_params.get("end_reason", ""),
                )
            ),
        ),
        Route("/api/compare", endpoint(_compare)),
    ]
    return Starlette(routes=routes)


def static_data(runs: Sequence[Run], per_step: int = 20) -> dict[str, Any]:
    """Everything the page shows, for a static file: each run's summary, curves, the comparison
    of its first and last evaluations, and of each logged step the best groups, whole, until
    they hold ``per_step`` episodes (``rollouts["RUN:STAGE:STEP"]``: ``groups``, ``total``)."""
    out: dict[str, Any] = {
        "runs": [run_summary(r) for r in runs], "metrics": [], "steps": [], "compare": [], "rollouts": {},
    }  # fmt: skip
    for i, run in enumerate(runs):
        out["metrics"].append(metric_series(run))
        out["compare"].append(default_comparison(run))
        steps = rollout_steps(run)
        out["steps"].append(steps)
        for s in steps:
            notes: list[str] = []
            every = step_episodes(run, s["step"], s["stage"], notes)
            kept: list[dict[str, Any]] = []
            for g in group_episodes(every):
                if sum(len(k["members"]) for k in kept) >= per_step:
                    break
                kept.append(g)
            out["rollouts"][f"{i}:{s['stage']}:{s['step']}"] = {
                "groups": kept,
                "total": len(every),
                "notes": notes,
            }
    return out


def write_static(paths: Sequence[str | Path], out: str | Path, *, per_step: int = 20) -> Path:
    """Write the page of the runs at ``paths`` once, as one self-contained HTML file, with the
    best groups of each logged step (``per_step`` episodes or a few more: groups stay whole)."""
    runs = find_runs(paths)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = static_data(runs, per_step=per_step)
    target.write_text(page_html(json.dumps(data, allow_nan=False)), encoding="utf-8")
    return target


def check_port(host: str, port: int) -> None:
    """Raise :class:`PortInUseError` when ``host:port`` cannot be bound because it is taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    f"port {port} on {host} is in use by another process; pass --port with a free "
                    "port (--port 0 picks one)"
                ) from exc
            raise


def serve(paths: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8765) -> int:
    """Serve the viewer of the runs at ``paths`` until interrupted (loopback by default)."""
    import uvicorn

    runs = find_runs(paths)
    if port:
        check_port(host, port)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        bound = sock.getsockname()[1]
        print(f"tempering view: {len(runs)} run(s) at http://{host}:{bound}/", flush=True)
        config = uvicorn.Config(build_app(runs), log_level="warning")
        uvicorn.Server(config).run(sockets=[sock])
    return 0
