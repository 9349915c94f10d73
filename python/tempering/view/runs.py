"""The runs ``tempering view`` shows: a run directory, or a recipe's directory with its stages.

Example::

    find_runs(["runs/demo"])   # [Run("demo", Path("runs/demo"), (Stage("sft", …), Stage("rl", …)))]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from tempering.fs import path_kind

__all__ = ["NotARunError", "Run", "Stage", "find_runs"]


class NotARunError(ValueError):
    """A directory given to ``tempering view`` holds no run."""


@attrs.frozen
class Stage:
    """A stage of a recipe's run: its name (the subdirectory's) and its run directory."""

    name: str
    path: Path


@attrs.frozen
class Run:
    """One run shown by the viewer: a label, its directory and, for a recipe's directory, its
    stages in the order they ran."""

    name: str
    path: Path
    stages: tuple[Stage, ...] = ()


def _is_run(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "metrics.jsonl").is_file()


def _started(path: Path) -> tuple[float, str]:
    """When a stage began: its ``config.json``'s modification time (written as it starts)."""
    for name in ("config.json", "metrics.jsonl"):
        try:
            return (path / name).stat().st_mtime, path.name
        except OSError:
            continue
    return 0.0, path.name


def find_runs(paths: Sequence[str | Path]) -> list[Run]:
    """The runs named by ``paths``, one per path: a run directory, or a recipe's directory (its
    subdirectories holding a run are its stages, in the order they started; the directory may
    hold a combined ``metrics.jsonl`` of its own, as ``tempering demo``'s does). A stage's
    directory given alone is a run of its own.

    Raises :class:`NotARunError` naming each path and what it lacks."""
    runs: list[Run] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            kind = path_kind(path)
            what = "no such directory" if kind.startswith("missing") else f"{kind}, not a directory"
            raise NotARunError(f"{path}: {what} (expected a run directory)")
        stages = sorted((p for p in path.iterdir() if p.is_dir() and _is_run(p)), key=_started)
        if not _is_run(path) and not stages:
            raise NotARunError(
                f"{path} is not a run directory: it has no config.json and no metrics.jsonl "
                "(written by tempering sft|dpo|rm|rl and the recipes), and no stage "
                "subdirectory holding them; pass the run's --run.log-dir"
            )
        runs.append(Run(path.resolve().name, path, tuple(Stage(p.name, p) for p in stages)))
    return runs
