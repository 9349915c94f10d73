"""The trajectory log's files: the RL format (``TRAJECTORY_SCHEMA``) and reading it back.

:mod:`tempering.rl.trajectories` writes the log (and re-exports what is here).

The RL format (``TRAJECTORY_SCHEMA``, version :data:`SCHEMA_VERSION` in the file metadata):

===================  ===================  =======================================================
column               type                 meaning
===================  ===================  =======================================================
``step``             int32                the training step whose update used this episode
``sampler_version``  int32                the policy version (training step of the weights) that
                                          sampled it; ``< step`` only in the ``async`` schedule
``group``            int32                the group's place among the step's groups (``0..P-1``)
``batch_group``      int32                the group's index in the batch it was drawn from
``member``           int32                the member in its group (``0..G-1``)
``episode_id``       string               ``"s<step>-p<group>-g<member>"``, unique in the run
``prompt_id``        string               hash of the episode's first observation tokens: the
                                          episodes of one prompt share it
``turn``             int32                the turn in its episode (``0..``)
``ob_tokens``        list<int32>          the observation's tokens (non-token chunks left out)
``ob_opaque``        int32                positions of non-token chunks (images) left out
``ob_extends``       bool                 the observation starts with the previous turn's
                                          observation and action (always false on turn 0)
``ac_tokens``        list<int32>          the sampled action tokens
``ac_logprobs``      list<float32>        the sampler's logprob of each action token (null when
                                          the sampler reported none)
``stop_reason``      string               ``"stop"`` or ``"length"``
``reward``           float64              the turn's reward
``episode_done``     bool                 the episode ends with this turn
``masked``           bool                 the turn was masked (no gradient)
``metrics``          string               the turn's env metrics, JSON
``total_reward``     float64              the episode's total: step rewards + group reward
``final_reward``     float64              the group reward of this member
``advantage``        float64              the episode's group-relative advantage, as trained on
``trained``          bool                 the group was trained on (false: constant rewards)
``end_reason``       string               ``"done"``, or the limit that ended it (``rollout_policy``)
``episode_metrics``  string               the member's group metrics, JSON
``tags``             list<string>         the group's logging tags
``seed``             int64                the group's sampling seed (null: unseeded)
===================  ===================  =======================================================
"""

# pyarrow ships no type information: its tables, arrays and types are Unknown to the checker.
# pyright: reportUnknownParameterType=false

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = [
    "PART",
    "SCHEMA_VERSION",
    "TRAJECTORY_SCHEMA",
    "VERSION_KEY",
    "TrajectoryLogError",
    "episodes_table",
    "read_trajectories",
    "trajectory_parts",
]

SCHEMA_VERSION = 1
"""The version of :data:`TRAJECTORY_SCHEMA`, in every part file's metadata."""

VERSION_KEY = b"tempering.trajectory_log.version"

TRAJECTORY_SCHEMA = pa.schema(
    [
        pa.field("step", pa.int32(), nullable=False),
        pa.field("sampler_version", pa.int32(), nullable=False),
        pa.field("group", pa.int32(), nullable=False),
        pa.field("batch_group", pa.int32(), nullable=False),
        pa.field("member", pa.int32(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("ob_tokens", pa.list_(pa.int32()), nullable=False),
        pa.field("ob_opaque", pa.int32(), nullable=False),
        pa.field("ob_extends", pa.bool_(), nullable=False),
        pa.field("ac_tokens", pa.list_(pa.int32()), nullable=False),
        pa.field("ac_logprobs", pa.list_(pa.float32())),
        pa.field("stop_reason", pa.string(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("episode_done", pa.bool_(), nullable=False),
        pa.field("masked", pa.bool_(), nullable=False),
        pa.field("metrics", pa.string(), nullable=False),
        pa.field("total_reward", pa.float64(), nullable=False),
        pa.field("final_reward", pa.float64(), nullable=False),
        pa.field("advantage", pa.float64(), nullable=False),
        pa.field("trained", pa.bool_(), nullable=False),
        pa.field("end_reason", pa.string(), nullable=False),
        pa.field("episode_metrics", pa.string(), nullable=False),
        pa.field("tags", pa.list_(pa.string()), nullable=False),
        pa.field("seed", pa.int64()),
    ],
    metadata={VERSION_KEY: str(SCHEMA_VERSION).encode()},
)
"""The RL format: one row per transition (see the module docstring for each column)."""

PART = re.compile(r"^step-(\d+)\.(parquet|jsonl)$")


class TrajectoryLogError(ValueError):
    """A trajectory log that cannot be read: a missing log, a malformed file, or a file whose
    schema is not :data:`TRAJECTORY_SCHEMA`. The message names the path."""


def trajectory_parts(path: str | os.PathLike[str]) -> list[Path]:
    """The RL-format part files that ``path`` names, in step order: a part file itself, a
    directory of parts (``…/trajectories/rl``), a trajectories directory, or a run directory.

    Raises ``FileNotFoundError`` when ``path`` does not exist and :class:`TrajectoryLogError`
    when it holds no trajectory log. Hidden (temporary) files are skipped.

    Example::

        trajectory_parts("runs/rl")   # [runs/rl/trajectories/rl/step-000000.parquet, ...]
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory (a trajectory log or an RL run directory)")
    if p.is_file():
        return [p]
    for candidate in (p / "trajectories" / "rl", p / "rl", p):
        if candidate.is_dir() and (candidate != p or p.name == "rl" or any(p.glob("step-*.parquet"))):
            return sorted(f for f in candidate.glob("*.parquet") if not f.name.startswith((".", "_")))
    raise TrajectoryLogError(
        f"{p}: no trajectory log here (expected {p / 'trajectories' / 'rl'}; run with "
        "RLConfig(log_trajectories=True))"
    )


def _check_schema(path: Path, schema: pa.Schema) -> None:
    meta = schema.metadata or {}
    if VERSION_KEY not in meta:
        raise TrajectoryLogError(
            f"{path}: not a tempering trajectory log (no {VERSION_KEY.decode()!r} in its metadata)"
        )
    version = meta[VERSION_KEY].decode()
    if version != str(SCHEMA_VERSION):
        raise TrajectoryLogError(
            f"{path}: trajectory log schema version {version}; this version of tempering reads "
            f"version {SCHEMA_VERSION}"
        )
    problems: list[str] = []
    for field in TRAJECTORY_SCHEMA:
        index = schema.get_field_index(field.name)
        if index < 0:
            problems.append(f"missing column {field.name!r}")
        elif schema.field(index).type != field.type:
            problems.append(f"column {field.name!r} is {schema.field(index).type}, expected {field.type}")
    if problems:
        raise TrajectoryLogError(f"{path}: schema does not match the trajectory log's: {'; '.join(problems)}")


def read_trajectories(path: str | os.PathLike[str]) -> pa.Table:
    """The trajectory log at ``path`` as one table (rows in step, group, member, turn order).

    ``path``: an RL run directory, its ``trajectories`` directory, the ``rl`` directory of
    parts, or one part file. Safe while the run writes (parts appear whole). An empty log gives
    an empty table. Raises :class:`TrajectoryLogError` naming the file for a file that is not
    Parquet, lacks the schema version, or has other columns or types.

    Example::

        table = read_trajectories("runs/demo/rl")
        episodes = table.filter(pc.field("episode_done"))     # one row per episode
        pc.mean(episodes.column("total_reward"))
    """
    tables: list[pa.Table] = []
    for part in trajectory_parts(path):
        try:
            schema = pq.read_schema(part)
        except (pa.ArrowException, OSError) as exc:
            raise TrajectoryLogError(f"{part}: not a readable Parquet file: {exc}") from exc
        _check_schema(part, schema)
        try:
            table = pq.read_table(part, columns=TRAJECTORY_SCHEMA.names)
        except (pa.ArrowException, OSError) as exc:
            raise TrajectoryLogError(f"{part}: malformed trajectory log part: {exc}") from exc
        tables.append(table.cast(TRAJECTORY_SCHEMA))
    if not tables:
        return TRAJECTORY_SCHEMA.empty_table()
    return pa.concat_tables(tables)


def episodes_table(table: pa.Table) -> pa.Table:
    """One row per episode of a trajectory table (its last turn's row), with ``n_turns``.

    Columns: ``episode_id``, ``prompt_id``, ``step``, ``sampler_version``, ``group``,
    ``member``, ``total_reward``, ``advantage``, ``trained``, ``end_reason``, ``tags``,
    ``n_turns``.

    Example::

        eps = episodes_table(read_trajectories("runs/rl"))
        pc.mean(eps.column("total_reward"))
    """
    last = table.filter(pc.field("episode_done"))
    keep = [
        "episode_id", "prompt_id", "step", "sampler_version", "group", "member",
        "total_reward", "advantage", "trained", "end_reason", "tags",
    ]  # fmt: skip
    out = last.select(keep)
    n_turns = last.column("turn").to_numpy() + np.int32(1)
    return out.append_column("n_turns", pa.array(n_turns, type=pa.int32()))
