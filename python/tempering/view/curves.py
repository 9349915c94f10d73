"""A run's curves for the viewer: one series per metric on one step axis, the key ones named.

A run's lines come from its ``metrics.jsonl``; a recipe's run with stages and no combined
``metrics.jsonl`` of its own has its stages' lines laid end to end (stage ``k``'s step ``s`` at
``offset_k + s + 1``, ``offset_k`` the last step of the stage before, as ``tempering demo``'s
combined lines count ``global_step``). So each metric is one series, drawn once.

Symbol / Description:

- ``groups``: prefix → metric → ``{"x": steps, "y": values}`` (and ``lo`` / ``hi``: a 95%
  interval logged as ``<metric>/ci95_low`` / ``<metric>/ci95_high``), downsampled; the key
  metrics and the single-point ones are not in it
- ``key``: the curves a researcher looks at first, in that order (reward, accuracy, the other
  held-out evaluations, KL and mismatch, loss, learning rate)
- ``scalars``: metric → ``{"x": step, "y": value}``, the metrics logged once (``initial/…``)
- ``stages``: ``{"name", "start", "end"}`` of each stage on the step axis
- ``clock``: ``{"x": steps, "t": seconds}``, wall time since the run began (``time/elapsed``,
  stage after stage), for the page's wall-time axis
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np

from tempering.training.rundir import RunDir
from tempering.view.runs import Run

__all__ = ["MAX_POINTS", "downsample", "key_metrics", "metric_series"]

MAX_POINTS = 2000
"""The most points a curve is sent with (min/max buckets keep its spikes)."""

_STEP_KEYS = frozenset({"step", "global_step"})
_CI = re.compile(r"^(.*)/ci95_(low|high)$")

_KEY_SLOTS: tuple[tuple[re.Pattern[str], bool], ...] = (
    (re.compile(r"^(env/)?reward/mean$|^(train/)?reward$"), False),  # reward: the first match only
    (re.compile(r"(^|/)accuracy[^/]*$"), True),
    (re.compile(r"^(test|eval)/"), True),
    (re.compile(r"(^|/)kl(/|_|$)|mismatch"), True),
    (re.compile(r"(^|/)loss(_sum)?$"), True),
    (re.compile(r"(^|/)(lr|learning_rate)$"), True),
)
MAX_KEY = 10


def key_metrics(names: Sequence[str]) -> list[str]:
    """The key curves among ``names``, in the order the page shows them first: the reward (one),
    accuracies, the other held-out evaluations, KL and mismatch, losses, learning rates (at most
    ``MAX_KEY``; ``initial/…`` and interval bounds never)."""
    pool = sorted(n for n in names if not n.startswith("initial/") and not _CI.match(n))
    out: list[str] = []
    for pattern, every in _KEY_SLOTS:
        hits = [n for n in pool if pattern.search(n) and n not in out]
        out.extend(hits if every else hits[:1])
    return out[:MAX_KEY]


def _downsample_idx(y: np.ndarray[Any, np.dtype[np.float64]], max_points: int) -> np.ndarray[Any, Any]:
    n = len(y)
    if n <= max_points:
        return np.arange(n)
    n_buckets = max(1, max_points // 2)
    size = -(-n // n_buckets)  # ceil: equal buckets of consecutive points, the last one short
    ys = np.full(n_buckets * size, np.nan)
    ys[:n] = y
    grid = ys.reshape(n_buckets, size)
    nan = np.isnan(grid)
    rows = np.arange(n_buckets)
    lo = np.where(nan, np.inf, grid).argmin(axis=1)
    hi = np.where(nan, -np.inf, grid).argmax(axis=1)
    keep = ~nan.all(axis=1)
    return np.unique(np.concatenate([(rows * size + lo)[keep], (rows * size + hi)[keep]]))


def downsample(
    x: Sequence[float], y: Sequence[float], max_points: int = MAX_POINTS
) -> tuple[list[float], list[float]]:
    """At most ``max_points`` points of a curve: for each of ``max_points // 2`` buckets of
    consecutive points, its minimum and maximum (in step order), so no spike is lost."""
    if len(x) <= max_points:
        return list(x), list(y)
    picks = _downsample_idx(np.asarray(y, dtype=np.float64), max_points)
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    return [float(v) for v in xs[picks]], [float(v) for v in ys[picks]]


def _number(v: object) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _lines(run: Run) -> list[tuple[int, str, dict[str, Any]]]:
    """``(step on the run's axis, stage name, line)``, one per step (the last written wins)."""
    own = RunDir(run.path)
    by_step: dict[int, tuple[str, dict[str, Any]]] = {}
    if own.metrics_path.is_file() or not run.stages:
        for line in own.read_metrics():
            step = line.get("global_step", line.get("step"))
            if _number(step) and int(step) == step:
                stage = line.get("stage")
                by_step[int(step)] = (stage if isinstance(stage, str) else "", line)
    else:
        offset = 0
        for stage in run.stages:
            last = offset
            for line in RunDir(stage.path).read_metrics():
                step = line.get("step")
                if _number(step) and int(step) == step:
                    last = max(last, offset + int(step) + 1)
                    by_step[offset + int(step) + 1] = (stage.name, line)
            offset = last
    return [(s, *by_step[s]) for s in sorted(by_step)]


def _stamp(run: Run) -> tuple[tuple[int, int], ...]:
    paths = [RunDir(run.path).metrics_path, *(RunDir(s.path).metrics_path for s in run.stages)]
    out: list[tuple[int, int]] = []
    for p in paths:
        try:
            st = p.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((0, -1))
    return tuple(out)


_SERIES_CACHE: dict[tuple[Path, int], tuple[tuple[tuple[int, int], ...], dict[str, Any]]] = {}


def metric_series(run: Run, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """The run's curves (see the module docstring) and ``steps`` (lines read) and ``last_step``.
    Read again only when a ``metrics.jsonl`` changed (its size or modification time)."""
    stamp = _stamp(run)
    key = (run.path.resolve(), max_points)
    cached = _SERIES_CACHE.get(key)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    series = _read_series(run, max_points)
    _SERIES_CACHE[key] = (stamp, series)
    return series


def _group(name: str) -> str:
    return name.split("/", 1)[0] if "/" in name else "main"


def _column(
    rows: list[tuple[int, str, dict[str, Any]]], name: str
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    xs = [s for s, _, line in rows if _number(line.get(name))]
    ys = [float(line[name]) for _, _, line in rows if _number(line.get(name))]
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def _clean(values: np.ndarray[Any, Any]) -> list[float | None]:
    return [None if math.isnan(v) else float(v) for v in values.tolist()]


def _read_series(run: Run, max_points: int) -> dict[str, Any]:
    rows = _lines(run)
    names = sorted({k for _, _, line in rows for k, v in line.items() if k not in _STEP_KEYS and _number(v)})
    bounds: dict[str, dict[str, str]] = {}
    for name in names:
        m = _CI.match(name)
        if m and m.group(1) in names:
            bounds.setdefault(m.group(1), {})[m.group(2)] = name
    banded = {n for b in bounds.values() if len(b) == 2 for n in b.values()}
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    scalars: dict[str, dict[str, float | None]] = {}
    curves: dict[str, dict[str, Any]] = {}
    for name in names:
        if name in banded:
            continue
        xs, ys = _column(rows, name)
        if len(xs) == 1:
            scalars[name] = {"x": float(xs[0]), "y": _clean(ys)[0]}
            continue
        picks = _downsample_idx(ys, max_points)
        curve: dict[str, Any] = {"x": xs[picks].tolist(), "y": _clean(ys[picks])}
        if len(bounds.get(name, {})) == 2:
            at = {float(s): i for i, s in enumerate(curve["x"])}
            for side, field in (("low", "lo"), ("high", "hi")):
                bx, by = _column(rows, bounds[name][side])
                vals: list[float | None] = [None] * len(curve["x"])
                for s, v in zip(bx.tolist(), _clean(by), strict=True):
                    if s in at:
                        vals[at[s]] = v
                curve[field] = vals
        curves[name] = curve
    key = key_metrics(list(curves))
    for name, curve in curves.items():
        if name not in key:
            groups.setdefault(_group(name), {})[name] = curve
    steps = [s for s, _, _ in rows]
    return {
        "groups": groups,
        "key": key,
        "curves": {n: curves[n] for n in key},
        "scalars": scalars,
        "stages": _stages(rows),
        "clock": _clock(rows, max_points),
        "steps": len(steps),
        "last_step": steps[-1] if steps else None,
    }


def _stages(rows: list[tuple[int, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step, stage, line in rows:
        if not stage:
            continue
        if out and out[-1]["name"] == stage:
            out[-1]["end"] = step
        else:
            own = line.get("step")
            offset = step - int(own) - 1 if _number(own) else 0  # the stage's step s is at offset + s + 1
            out.append({"name": stage, "start": step, "end": step, "offset": offset})
    return out


def _clock(rows: list[tuple[int, str, dict[str, Any]]], max_points: int) -> dict[str, list[float]]:
    """Wall seconds at each step: ``time/elapsed``, each stage after the one before it."""
    xs: list[float] = []
    ts: list[float] = []
    base, last, prev_stage = 0.0, 0.0, None
    for step, stage, line in rows:
        elapsed = line.get("time/elapsed")
        if not _number(elapsed) or not math.isfinite(float(elapsed)):
            continue
        if prev_stage is not None and stage != prev_stage:
            base = last
        prev_stage = stage
        last = base + float(elapsed)
        xs.append(float(step))
        ts.append(last)
    if len(xs) > max_points:
        picks = np.unique(np.linspace(0, len(xs) - 1, max_points).round().astype(int))
        xs = [xs[i] for i in picks]
        ts = [ts[i] for i in picks]
    return {"x": xs, "t": ts}
