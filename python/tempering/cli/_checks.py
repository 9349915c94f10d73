"""Checks of a command's flags before anything is written.

tyro builds the config; the config classes check what their own validators check. This module
adds what holds for every command, so a bad value is refused by its flag name before a run
directory, a model or any output exists:

- a flag given twice (``--max-steps 3 --max-steps 5``) or both ways (``--run.progress
  --run.no-progress``) is refused, never resolved silently to the last one;
- every integer is a count: negative values are refused (never bent to 0), and the fields in
  :data:`AT_LEAST_ONE` need at least 1;
- every float is a number: NaN is refused, learning rates must be > 0 (an explicit 0 is
  refused, never replaced by a default), and temperatures, coefficients, timeouts, fractions
  and ratios must be >= 0 (fractions at most 1);
- a path that exists but is the wrong kind (a directory given as a data file, a FIFO, a symlink
  loop, a file given as a run directory) is named as what it is.

Example::

    check_flags(["--max-steps", "3", "--max-steps", "5"])   # FlagError: --max-steps given twice ...
    check_config(config)   # FlagError: --data.batch-size must be an integer >= 1, got -1
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from tempering.fs import blocking_file, path_kind

__all__ = ["AT_LEAST_ONE", "FlagError", "check_config", "check_flags"]


class FlagError(ValueError):
    """A flag whose value cannot be right; the message names the flag and the value."""


AT_LEAST_ONE = frozenset(
    {
        "batch_size",
        "concurrency",
        "group_size",
        "limit",
        "max_answer_chars",
        "max_concurrent_samples",
        "max_length",
        "max_steps",
        "max_tokens",
        "max_trajectory_tokens",
        "max_turns",
        "n_batches",
        "num_epochs",
        "num_samples",
        "num_steps",
        "num_substeps",
        "workers",
    }
)
"""Integer fields (by name, at any depth) that count something a run needs at least one of."""

_NON_NEGATIVE_FLOAT_SUFFIXES = ("_coef", "_timeout_s", "_s", "_fraction", "_ratio", "temperature")
_AT_MOST_ONE_SUFFIXES = ("_fraction",)
_POSITIVE_FLOATS = frozenset({"beta"})
_DIR_FIELDS = ("log_dir", "out", "data_dir", "output_dir")
_FILE_SUFFIXES = ("_path", "_file")


def _flag(path: Sequence[str]) -> str:
    return "--" + ".".join(p.replace("_", "-") for p in path)


def check_flags(argv: Sequence[str]) -> None:
    """Refuse a flag given twice, or a boolean given both ways (``--x`` and ``--no-x``)."""
    end = list(argv).index("--") if "--" in argv else len(argv)
    seen: dict[str, str] = {}
    for token in argv[:end]:
        if not token.startswith("--") or token in ("--help", "--"):
            continue
        name = token.split("=", 1)[0]
        group, dot, leaf = name[2:].rpartition(".")
        canonical = f"{group}{dot}{leaf.removeprefix('no-')}"
        if canonical in seen:
            first = seen[canonical]
            if first == name:
                raise FlagError(f"{name} is given twice; give it once")
            raise FlagError(f"{first} and {name} are both given; they contradict each other, give one")
        seen[canonical] = name


def _is_scheme(value: str) -> bool:
    head = value.split("/", 1)[0]
    return ":" in head  # hf:, tempering-assets:, tinker://, tempering://, s3://


def _check_value(path: list[str], value: object) -> None:
    name = path[-1]
    flag = _flag(path)
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        minimum = 1 if name in AT_LEAST_ONE else 0
        if value < minimum:
            raise FlagError(f"{flag} must be an integer >= {minimum}, got {value}")
    elif isinstance(value, float):
        if math.isnan(value):
            raise FlagError(f"{flag} must be a number, got nan")
        if (name in _POSITIVE_FLOATS or name.endswith("learning_rate")) and not value > 0:
            raise FlagError(f"{flag} must be > 0, got {value}")
        if name.endswith(_NON_NEGATIVE_FLOAT_SUFFIXES) and value < 0:
            raise FlagError(f"{flag} must be >= 0, got {value}")
        if name.endswith(_AT_MOST_ONE_SUFFIXES) and value > 1:
            raise FlagError(f"{flag} must be a fraction in [0, 1], got {value}")
    elif isinstance(value, str) and value and not _is_scheme(value):
        if name in _DIR_FIELDS or name.endswith("_dir"):
            kind = path_kind(value)
            blocker = blocking_file(value) if kind.startswith("missing (") else None
            if blocker is not None:
                raise FlagError(
                    f"{flag} {value} cannot be made: {blocker} is {path_kind(blocker)} where a directory "
                    "is expected; move it away, or choose another directory"
                )
            if kind not in ("a directory", "missing"):
                raise FlagError(f"{flag} {value} is {kind}, not a directory; give a directory")
        elif name == "init_state":
            kind = path_kind(value)
            if kind != "a directory":
                raise FlagError(
                    f"{flag} {value} is {kind}, not a checkpoint directory; give a save_state path"
                )
        elif name == "path" or name.endswith(_FILE_SUFFIXES):
            kind = path_kind(value)
            if kind not in ("a regular file", "a directory", "missing") or (
                kind == "a directory" and name in ("path", "data_path")
            ):
                raise FlagError(f"{flag} {value} is {kind}, not a regular file; give the path of a file")


def _walk(config: object, path: list[str], depth: int = 0) -> None:
    if depth > 8:
        return
    if attrs.has(type(config)):
        for field in attrs.fields(type(config)):
            value: object = getattr(config, field.name)
            _walk(value, [*path, field.name], depth + 1)
    elif path:
        _check_value(path, value=config)


def check_config(config: object) -> None:
    """Check every numeric and path field of ``config`` (an attrs config) as the module says."""
    _walk(config, [])
