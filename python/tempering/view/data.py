"""What ``tempering view`` reads from a run directory: metrics, trajectory logs, config, checkpoints.

Only files are read (never a lock, never a write): a run in progress is read as it is, a torn
last metrics line is ignored, a Parquet part that cannot be read (mid-write, corrupt) is skipped
with a note, and a run that resumed after a crash (metrics cut back and written again) is read
as one line per step, the last written winning.

Rollouts come from the RL trajectory log (``trajectories/rl/step-NNNNNN.parquet`` with its
decoded text in ``trajectories/text/``) and from evaluation rollouts
(``trajectories/eval/step-NNNNNN.jsonl``, one episode per line, written by
:func:`write_eval_rollouts`: e.g. ``tempering demo``'s held-out answers at each evaluation).
"""

# pyarrow ships no type information: its tables and arrays are Unknown to the checker.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tempering.backend import load_tokenizer
from tempering.training.rundir import RunDir

__all__ = [
    "NotARunError",
    "Run",
    "downsample",
    "eval_rollouts_path",
    "find_runs",
    "metric_series",
    "rollout_page",
    "rollout_steps",
    "run_summary",
    "write_eval_rollouts",
]

MAX_POINTS = 2000
"""The most points a curve is sent with (min/max buckets keep its spikes)."""

_STEP_PART = re.compile(r"^step-(\d+)\.parquet$")
_EVAL_PART = re.compile(r"^step-(\d+)\.jsonl$")


class NotARunError(ValueError):
    """A directory given to ``tempering view`` holds no run."""


@attrs.frozen
class Run:
    """One run shown by the viewer: a label and its directory."""

    name: str
    path: Path


def _is_run(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "metrics.jsonl").is_file()


def find_runs(paths: Sequence[str | Path]) -> list[Run]:
    """The runs named by ``paths``: a run directory, a recipe's directory of stage runs (each
    subdirectory holding a run is one), or both (a run directory with stage runs inside).

    Raises :class:`NotARunError` naming each path and what it lacks."""
    runs: list[Run] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise NotARunError(f"{path}: no such directory (expected a run directory)")
        stages = sorted(p for p in path.iterdir() if p.is_dir() and _is_run(p))
        if _is_run(path):
            runs.append(Run(path.resolve().name, path))
        elif not stages:
            raise NotARunError(
                f"{path} is not a run directory: it has no config.json and no metrics.jsonl "
                "(written by tempering sft|dpo|rm|rl and the recipes), and no stage "
                "subdirectory holding them; pass the run's --run.log-dir"
            )
        runs.extend(Run(f"{path.resolve().name}/{p.name}", p) for p in stages)
    return runs


def downsample(
    x: Sequence[float], y: Sequence[float], max_points: int = MAX_POINTS
) -> tuple[list[float], list[float]]:
    """At most ``max_points`` points of a curve: for each of ``max_points // 2`` buckets of
    consecutive points, its minimum and maximum (in step order), so no spike is lost."""
    if len(x) <= max_points:
        return list(x), list(y)
    n_buckets = max(1, max_points // 2)
    size = -(-len(x) // n_buckets)  # ceil: equal buckets of consecutive points, the last one short
    ys = np.full(n_buckets * size, np.nan)
    ys[: len(y)] = np.asarray(y, dtype=np.float64)
    grid = ys.reshape(n_buckets, size)
    nan = np.isnan(grid)
    rows = np.arange(n_buckets)
    lo = np.where(nan, np.inf, grid).argmin(axis=1)
    hi = np.where(nan, -np.inf, grid).argmax(axis=1)
    keep = ~nan.all(axis=1)
    picks = np.unique(np.concatenate([(rows * size + lo)[keep], (rows * size + hi)[keep]]))
    xs = np.asarray(x, dtype=np.float64)
    return [float(v) for v in xs[picks]], [float(v) for v in ys[picks]]


def _group(name: str) -> str:
    return name.split("/", 1)[0] if "/" in name else "main"


_SERIES_CACHE: dict[tuple[Path, int], tuple[tuple[int, int], dict[str, Any]]] = {}


def metric_series(run: Run, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """Every numeric metric of the run, one line per step (the last written), downsampled:
    ``{"groups": {prefix: {metric: {"x": steps, "y": values}}}, "steps": n, "last_step": s}``.
    A line's step is its ``global_step`` when it has one (a recipe's combined metrics, whose
    stages each count ``step`` from 0), else its ``step``.
    Read again only when ``metrics.jsonl`` changed (its size or modification time)."""
    path = RunDir(run.path).metrics_path
    try:
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = (0, -1)
    key = (path.resolve(), max_points)
    cached = _SERIES_CACHE.get(key)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    series = _read_series(run, max_points)
    _SERIES_CACHE[key] = (stamp, series)
    return series


def _read_series(run: Run, max_points: int) -> dict[str, Any]:
    by_step: dict[int, dict[str, Any]] = {}
    for line in RunDir(run.path).read_metrics():
        step = line.get("global_step", line.get("step"))
        if isinstance(step, int) and not isinstance(step, bool):
            by_step[step] = line  # a resumed run writes a step again: the last one holds
    steps = sorted(by_step)
    names = sorted(
        {k for line in by_step.values() for k, v in line.items() if k not in _STEP_KEYS and _number(v)}
    )
    groups: dict[str, dict[str, dict[str, list[float | None]]]] = {}
    for name in names:
        xs = [float(s) for s in steps if _number(by_step[s].get(name))]
        ys = [float(by_step[int(s)][name]) for s in xs]
        dx, dy = downsample(xs, ys, max_points)
        groups.setdefault(_group(name), {})[name] = {
            "x": list(dx),
            "y": [None if math.isnan(v) else v for v in dy],
        }
    return {"groups": groups, "steps": len(steps), "last_step": steps[-1] if steps else None}


_STEP_KEYS = frozenset({"step", "global_step"})


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _rl_dir(run: Run) -> Path:
    return run.path / "trajectories" / "rl"


def eval_rollouts_path(run_dir: str | Path, step: int) -> Path:
    """Where the evaluation rollouts of ``step`` go: ``<run_dir>/trajectories/eval/step-NNNNNN.jsonl``."""
    return Path(run_dir) / "trajectories" / "eval" / f"step-{step:06d}.jsonl"


def write_eval_rollouts(run_dir: str | Path, step: int, episodes: Sequence[dict[str, Any]]) -> Path:
    """Write evaluation rollouts for the viewer: one JSON object per episode, in the shape of
    :func:`rollout_page`'s episodes (``episode_id``, ``group``, ``member``, ``tags``,
    ``total_reward``, ``advantage``, ``end_reason``, and ``turns``, each with ``turn``,
    ``reward``, ``observation``, ``action``, ``ac_tokens``, ``ac_logprobs``, ``ac_pieces``).
    Written whole to a hidden file, then renamed: a reader never sees a part of it.

    Example::

        write_eval_rollouts("runs/demo", 600, [{"episode_id": "e0", "turns": [...], ...}])
    """
    path = eval_rollouts_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name)
    tmp.write_text("".join(json.dumps(e) + "\n" for e in episodes), encoding="utf-8")
    tmp.replace(path)
    return path


def _steps_in(d: Path, pattern: re.Pattern[str]) -> set[int]:
    if not d.is_dir():
        return set()
    return {int(m.group(1)) for f in d.iterdir() if (m := pattern.match(f.name))}


def rollout_steps(run: Run) -> list[int]:
    """The steps with a trajectory-log part or evaluation rollouts (hidden temporary files
    skipped)."""
    rl = _steps_in(_rl_dir(run), _STEP_PART)
    return sorted(rl | _steps_in(eval_rollouts_path(run.path, 0).parent, _EVAL_PART))


def _text_records(run: Run, step: int) -> dict[str, dict[str, Any]]:
    path = run.path / "trajectories" / "text" / f"step-{step:06d}.jsonl"
    out: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line: the part is rewritten whole, so only mid-write
            if isinstance(rec, dict) and "episode_id" in rec:
                out[str(rec["episode_id"])] = rec
    return out


@functools.cache
def _tokenizer(base_model: str) -> Any:
    """The run's tokenizer when it can be had offline (the built-in tiny model, or a local
    model directory); ``None`` otherwise (the viewer never downloads)."""
    if base_model != "tempering/tiny" and not Path(base_model).is_dir():
        return None
    try:
        return load_tokenizer(base_model)
    except (OSError, ValueError, ImportError):
        return None


def _run_tokenizer(run: Run) -> Any:
    try:
        config = json.loads((run.path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    model = config.get("model") if isinstance(config, dict) else None
    base = model.get("base_model") if isinstance(model, dict) else None
    return _tokenizer(base) if isinstance(base, str) else None


def _rl_episodes(run: Run, step: int, notes: list[str]) -> list[dict[str, Any]]:
    """Step ``step``'s episodes from the RL trajectory log (none when it has no part)."""
    part = _rl_dir(run) / f"step-{step:06d}.parquet"
    if not part.is_file():
        return []
    try:
        table = pq.read_table(part)
    except (pa.ArrowException, OSError) as exc:
        notes.append(f"{part}: skipped, not a readable Parquet file (mid-write or corrupt): {exc}")
        return []
    rows: list[dict[str, Any]] = table.to_pylist()
    episodes: dict[str, dict[str, Any]] = {}
    for row in rows:
        ep = episodes.setdefault(
            str(row["episode_id"]),
            {
                "episode_id": row["episode_id"],
                "group": row["group"],
                "member": row["member"],
                "tags": row.get("tags") or [],
                "turns": [],
            },
        )
        ep["turns"].append(
            {
                "turn": row["turn"],
                "reward": row["reward"],
                "ac_tokens": row["ac_tokens"] or [],
                "ac_logprobs": row.get("ac_logprobs"),
                "stop_reason": row.get("stop_reason"),
            }
        )
        if row["episode_done"]:
            ep.update(
                total_reward=row["total_reward"],
                advantage=row["advantage"],
                trained=row["trained"],
                end_reason=row["end_reason"],
            )
    texts = _text_records(run, step)
    if not texts:
        notes.append(f"step {step}: no decoded text logged (trajectories/text); showing token ids")
    tokenizer = _run_tokenizer(run)
    for ep in episodes.values():
        if tokenizer is not None:
            for turn in ep["turns"]:
                turn["ac_pieces"] = [str(tokenizer.decode([t])) for t in turn["ac_tokens"]]
        rec = texts.get(ep["episode_id"])
        rec_turns: list[Any] = rec.get("turns", []) if rec else []
        for i, turn in enumerate(ep["turns"]):
            if i < len(rec_turns) and isinstance(rec_turns[i], dict):
                turn["observation"] = rec_turns[i].get("observation")
                turn["action"] = rec_turns[i].get("action")
    return list(episodes.values())


def _eval_episodes(run: Run, step: int, notes: list[str]) -> list[dict[str, Any]]:
    """Step ``step``'s evaluation rollouts (:func:`write_eval_rollouts`); a line that is not an
    episode is skipped with a note."""
    path = eval_rollouts_path(run.path, step)
    if not path.is_file():
        return []
    out: list[dict[str, Any]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            ep = json.loads(line)
        except json.JSONDecodeError:
            ep = None
        if not isinstance(ep, dict) or not isinstance(ep.get("turns"), list) or "episode_id" not in ep:
            notes.append(f"{path}:{n}: skipped, not an episode (JSON with episode_id and turns)")
            continue
        ep.setdefault("tags", [])
        ep.setdefault("group", 0)
        ep.setdefault("member", 0)
        out.append(ep)
    return out


def rollout_page(
    run: Run,
    step: int,
    offset: int = 0,
    limit: int = 20,
    sort: str = "best",
    *,
    tag: str = "",
    end_reason: str = "",
) -> dict[str, Any]:
    """One page of step ``step``'s episodes: reward, advantage, tags, per turn the decoded
    observation and action (when the run logged text) and the action's tokens and logprobs
    (and each token's text, ``ac_pieces``, when the run's tokenizer is available offline).

    ``sort``: ``best`` (highest total reward first), ``worst`` or ``order`` (group, member).
    ``tag`` / ``end_reason``: only the episodes with that logging tag / end reason (``""``: all);
    the answer lists the step's ``tags`` and ``end_reasons`` to choose from.
    A part that cannot be read gives no episodes and a ``note`` naming the file."""
    notes: list[str] = []
    every = _rl_episodes(run, step, notes) + _eval_episodes(run, step, notes)
    if not every and not notes:
        notes.append(f"{_rl_dir(run) / f'step-{step:06d}.parquet'}: no trajectory log part for step {step}")
    ordered = [
        e
        for e in every
        if (not tag or tag in e["tags"]) and (not end_reason or e.get("end_reason") == end_reason)
    ]
    if sort in ("best", "worst"):
        ordered.sort(key=lambda e: float(e.get("total_reward") or 0.0), reverse=sort == "best")
    else:
        ordered.sort(key=lambda e: (e["group"], e["member"]))
    return {
        "step": step,
        "total": len(ordered),
        "tags": sorted({t for e in every for t in e["tags"]}),
        "end_reasons": sorted({str(e.get("end_reason")) for e in every}),
        "episodes": ordered[offset : offset + limit],
        "notes": notes,
    }


def run_summary(run: Run) -> dict[str, Any]:
    """The run's name, path, config (``config.json``) and checkpoint index."""
    rd = RunDir(run.path)
    notes: list[str] = []
    config: Any = None
    if rd.config_path.is_file():
        try:
            config = json.loads(rd.config_path.read_text())
        except (json.JSONDecodeError, OSError) as exc:
            notes.append(f"{rd.config_path}: unreadable ({exc})")
    try:
        checkpoints = [r.to_json() for r in rd.checkpoints()]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        checkpoints = []
        notes.append(f"{rd.index_path}: unreadable ({exc})")
    return {
        "name": run.name,
        "path": str(run.path),
        "config": config,
        "checkpoints": checkpoints,
        "notes": notes,
    }
