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
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tempering.backend import load_tokenizer
from tempering.backends import serving
from tempering.training.rundir import RunDir
from tempering.view.curves import MAX_POINTS, downsample, metric_series
from tempering.view.runs import NotARunError, Run, Stage, find_runs

__all__ = [
    "MAX_POINTS",
    "NotARunError",
    "Run",
    "Stage",
    "downsample",
    "eval_rollouts_path",
    "find_runs",
    "group_episodes",
    "metric_series",
    "rollout_page",
    "rollout_steps",
    "run_summary",
    "step_episodes",
    "write_eval_rollouts",
]

_STEP_PART = re.compile(r"^step-(\d+)\.parquet$")
_EVAL_PART = re.compile(r"^step-(\d+)\.jsonl$")


def _rl_dir(d: Path) -> Path:
    return d / "trajectories" / "rl"


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


def _text_records(d: Path, step: int) -> dict[str, dict[str, Any]]:
    path = d / "trajectories" / "text" / f"step-{step:06d}.jsonl"
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
    """The run's tokenizer when it can be had offline (a backend's built-in model such as
    ``tempering/tiny``, or a local model directory); ``None`` otherwise (the viewer never
    downloads)."""
    if serving(base_model) is None and not Path(base_model).is_dir():
        return None
    try:
        return load_tokenizer(base_model)
    except (OSError, ValueError, ImportError):
        return None


def _run_tokenizer(d: Path) -> Any:
    try:
        config = json.loads((d / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    model = config.get("model") if isinstance(config, dict) else None
    base = model.get("base_model") if isinstance(model, dict) else None
    return _tokenizer(base) if isinstance(base, str) else None


def _rl_episodes(d: Path, step: int, notes: list[str]) -> list[dict[str, Any]]:
    """Step ``step``'s episodes from the RL trajectory log (none when it has no part)."""
    part = _rl_dir(d) / f"step-{step:06d}.parquet"
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
    texts = _text_records(d, step)
    if not texts:
        notes.append(f"step {step}: no decoded text logged (trajectories/text); showing token ids")
    tokenizer = _run_tokenizer(d)
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


def _eval_episodes(d: Path, step: int, notes: list[str]) -> list[dict[str, Any]]:
    """Step ``step``'s evaluation rollouts (:func:`write_eval_rollouts`); a line that is not an
    episode is skipped with a note."""
    path = eval_rollouts_path(d, step)
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


def _sources(run: Run) -> list[tuple[str, Path, int | None]]:
    """``(stage, directory, offset)`` of each place the run's rollouts are logged: the run's own
    directory (stage ``""``, its steps already on the run's axis) and each stage's (its step
    ``s`` at ``offset + s + 1``; ``None`` when the run's curves do not place the stage)."""
    offsets = {s["name"]: int(s["offset"]) for s in metric_series(run)["stages"]} if run.stages else {}
    return [("", run.path, None), *((s.name, s.path, offsets.get(s.name)) for s in run.stages)]


def rollout_steps(run: Run) -> list[dict[str, Any]]:
    """The steps with a trajectory-log part (``train``) or evaluation rollouts (``eval``), of
    the run and of each of its stages (hidden temporary files skipped), in the order of the
    run's step axis: ``{"stage", "step", "global", "kinds"}``."""
    out: list[dict[str, Any]] = []
    for stage, d, offset in _sources(run):
        train = _steps_in(_rl_dir(d), _STEP_PART)
        evals = _steps_in(eval_rollouts_path(d, 0).parent, _EVAL_PART)
        for step in sorted(train | evals):
            out.append(
                {
                    "stage": stage,
                    "step": step,
                    "global": step if offset is None else offset + step + 1,
                    "kinds": [k for k, steps in (("train", train), ("eval", evals)) if step in steps],
                }
            )
    out.sort(key=lambda e: (e["global"], e["stage"]))
    return out


def _source(run: Run, stage: str) -> Path:
    if not stage:
        return run.path
    for s in run.stages:
        if s.name == stage:
            return s.path
    names = ", ".join(s.name for s in run.stages) or "none"
    raise ValueError(f"run {run.name!r} has no stage {stage!r} (stages: {names})")


def step_episodes(
    run: Run, step: int, stage: str = "", notes: list[str] | None = None
) -> list[dict[str, Any]]:
    """Every episode logged at ``step`` of ``stage`` (``""``: the run's own directory):
    training rollouts, then evaluation rollouts; an unreadable part adds a note to ``notes``."""
    notes = [] if notes is None else notes
    d = _source(run, stage)
    return _rl_episodes(d, step, notes) + _eval_episodes(d, step, notes)


def _mean_reward(members: list[dict[str, Any]]) -> float:
    return sum(float(e.get("total_reward") or 0.0) for e in members) / max(1, len(members))


def group_episodes(episodes: list[dict[str, Any]], sort: str = "best") -> list[dict[str, Any]]:
    """Episodes by group (the prompt they share): ``{"group", "size", "mean_reward", "prompt",
    "tags", "members"}``, best (highest mean total reward) first, ``worst`` first or in group
    ``order``; the members best first (``order``: by member)."""
    by: dict[Any, list[dict[str, Any]]] = {}
    for ep in episodes:
        by.setdefault(ep["group"], []).append(ep)
    out: list[dict[str, Any]] = []
    for g, members in by.items():
        if sort == "order":
            members.sort(key=lambda e: e["member"])
        else:
            members.sort(key=lambda e: float(e.get("total_reward") or 0.0), reverse=sort != "worst")
        turns = members[0].get("turns") or [{}]
        prompt = turns[0].get("observation") or members[0]["episode_id"]
        out.append(
            {
                "group": g,
                "size": len(members),
                "mean_reward": _mean_reward(members),
                "prompt": str(prompt)[:200],
                "tags": sorted({t for e in members for t in e["tags"]}),
                "members": members,
            }
        )
    if sort in ("best", "worst"):
        out.sort(key=lambda g: g["mean_reward"], reverse=sort == "best")
    else:
        out.sort(key=lambda g: g["group"])
    return out


def rollout_page(
    run: Run,
    step: int,
    *,
    stage: str = "",
    group: int | None = None,
    sort: str = "best",
    tag: str = "",
    end_reason: str = "",
) -> dict[str, Any]:
    """Step ``step``'s episodes (of ``stage``), one group at a time: ``groups`` (every group's
    summary, in ``sort`` order: ``best``, ``worst`` or ``order``), ``group`` (the one shown:
    ``group``, else the first) and ``episodes`` (its members), each with reward, advantage,
    tags, per turn the decoded observation and action (when the run logged text) and the
    action's tokens and logprobs (and each token's text, ``ac_pieces``, when the run's tokenizer
    is available offline). ``tag`` / ``end_reason``: only the episodes with that logging tag /
    end reason (``""``: all); the answer lists the step's ``tags`` and ``end_reasons``.
    A part that cannot be read gives no episodes and a ``note`` naming the file."""
    notes: list[str] = []
    every = step_episodes(run, step, stage, notes)
    if not every and not notes:
        part = _rl_dir(_source(run, stage)) / f"step-{step:06d}.parquet"
        notes.append(f"{part}: no trajectory log part for step {step}")
    kept = [
        e
        for e in every
        if (not tag or tag in e["tags"]) and (not end_reason or e.get("end_reason") == end_reason)
    ]
    groups = group_episodes(kept, sort)
    shown = next((g for g in groups if g["group"] == group), groups[0] if groups else None)
    return {
        "stage": stage,
        "step": step,
        "total": len(kept),
        "tags": sorted({t for e in every for t in e["tags"]}),
        "end_reasons": sorted({str(e.get("end_reason")) for e in every}),
        "groups": [{k: v for k, v in g.items() if k != "members"} for g in groups],
        "group": shown["group"] if shown else None,
        "episodes": shown["members"] if shown else [],
        "notes": notes,
    }


def run_summary(run: Run) -> dict[str, Any]:
    """The run's name, path, stage names, figures (the numbers of a recipe's ``summary.json``),
    config (``config.json``) and checkpoint index."""
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
    figures: dict[str, float] = {}
    summary = run.path / "summary.json"
    if summary.is_file():
        try:
            loaded: Any = json.loads(summary.read_text())
            if isinstance(loaded, dict):
                figures = {
                    str(k): v
                    for k, v in loaded.items()
                    if isinstance(v, int | float) and not isinstance(v, bool)
                }
        except (json.JSONDecodeError, OSError) as exc:
            notes.append(f"{summary}: unreadable ({exc})")
    return {
        "name": run.name,
        "path": str(run.path),
        "stages": [s.name for s in run.stages],
        "stage_runs": [run_summary(Run(f"{run.name}/{s.name}", s.path)) for s in run.stages],
        "figures": figures,
        "config": config,
        "checkpoints": checkpoints,
        "notes": notes,
    }
