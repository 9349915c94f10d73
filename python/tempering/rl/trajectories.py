"""Trajectory logs: every rollout of an RL run, as Parquet (tokens) and as text (JSONL).

With ``RLConfig(log_trajectories=True)`` each training step writes, under
``<log_dir>/trajectories/``::

    rl/step-000012.parquet     one row per transition (turn) of every member of every group
    text/step-000012.jsonl     one line per episode, the turns decoded with the tokenizer

Each file is complete when it appears (written to a hidden temporary name, synced, renamed), so
the log can be read while the run goes on (:func:`read_trajectories`, or
``pyarrow.dataset.dataset(".../trajectories/rl")``, which skips the hidden temporary files).
A step's files are rewritten whole when a resumed run repeats the step, and the files of steps at
or after the resume point are removed when the run (re)starts: no row is ever duplicated.

Shapes (docs/notation.md): ``P`` groups of the step, ``G`` members of a group, ``X`` transitions
(rows), ``T`` tokens of one row; ``_R`` rows of a table (transitions), ``_E`` episodes.

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
``end_reason``       string               ``"done"``, ``"max_turns"`` or ``"token_budget"``
``episode_metrics``  string               the member's group metrics, JSON
``tags``             list<string>         the group's logging tags
``seed``             int64                the group's sampling seed (null: unseeded)
===================  ===================  =======================================================

The language format: one JSON object per episode with ``step``, ``group``, ``member``,
``episode_id``, ``prompt_id``, ``sampler_version``, ``tags``, ``total_reward``, ``advantage``,
``text`` (the whole episode: observations and actions, decoded) and ``turns`` (per turn:
``observation`` — only the new part when ``continues`` is true —, ``action``, ``reward``,
``masked``).

Example::

    config = RLConfig(run=RunConfig(log_dir="runs/rl"), dataset=ArithmeticTask(),
                      log_trajectories=True)
    await config()
    table = read_trajectories("runs/rl")           # pyarrow.Table, one row per transition
    table.filter(pc.field("episode_done")).column("total_reward")
"""

# pyarrow ships no type information: its tables, arrays and types are Unknown to the checker.
# pyright: reportUnknownParameterType=false

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import attrs
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import tinker
from tinker.types import EncodedTextChunk

from tempering import _core
from tempering.rl.data import Baseline, compute_advantages
from tempering.rl.rollouts import GroupRollout
from tempering_protocols import Tokenizer
from tempering_protocols.rendering import decode_text

__all__ = [
    "SCHEMA_VERSION",
    "TRAJECTORY_SCHEMA",
    "StepLog",
    "TrajectoryLog",
    "TrajectoryLogError",
    "episodes_table",
    "read_trajectories",
    "rollouts_to_table",
    "table_to_text_records",
    "trajectory_parts",
]

SCHEMA_VERSION = 1
"""The version of :data:`TRAJECTORY_SCHEMA`, in every part file's metadata."""

_VERSION_KEY = b"tempering.trajectory_log.version"

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
    metadata={_VERSION_KEY: str(SCHEMA_VERSION).encode()},
)
"""The RL format: one row per transition (see the module docstring for each column)."""

_PART = re.compile(r"^step-(\d+)\.(parquet|jsonl)$")

Int32Array = npt.NDArray[np.int32]
Int64Array = npt.NDArray[np.int64]
Float32Array = npt.NDArray[np.float32]
Float64Array = npt.NDArray[np.float64]


class TrajectoryLogError(ValueError):
    """A trajectory log that cannot be read: a missing log, a malformed file, or a file whose
    schema is not :data:`TRAJECTORY_SCHEMA`. The message names the path."""


# ------------------------------------------------------------------------------ rollouts → table


def _ob_tokens(ob: tinker.ModelInput) -> tuple[Int32Array, int]:
    """The token chunks of an observation, concatenated, and the positions of its other chunks."""
    parts: list[Int32Array] = []
    opaque = 0
    for chunk in ob.chunks:
        if isinstance(chunk, EncodedTextChunk):
            parts.append(np.asarray(chunk.tokens, dtype=np.int32))
        else:
            opaque += chunk.length
    if not parts:
        return np.zeros(0, dtype=np.int32), opaque
    return (parts[0] if len(parts) == 1 else np.concatenate(parts)), opaque


def _list_array(
    parts: Sequence[npt.NDArray[np.generic]], dtype: pa.DataType, null_D: list[bool] | None = None
) -> pa.ListArray:
    """A list array from per-row numpy arrays: one concatenation and an offsets array."""
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int32, count=len(parts))
    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(parts) if parts else np.zeros(0)
    mask = None if null_D is None or not any(null_D) else pa.array(null_D, type=pa.bool_())
    return pa.ListArray.from_arrays(
        pa.array(offsets, type=pa.int32()), pa.array(values, type=dtype), type=pa.list_(dtype), mask=mask
    )


def _prompt_id(tokens_T: Int32Array) -> str:
    return hashlib.blake2b(np.ascontiguousarray(tokens_T).tobytes(), digest_size=8).hexdigest()


def rollouts_to_table(
    step: int,
    rollouts_P: Sequence[GroupRollout],
    *,
    baseline: Baseline = "mean",
    normalize_std: bool = False,
    keep_constant: bool = False,
) -> pa.Table:
    """The rows of one training step: every transition of every member of every scored group.

    ``rollouts_P`` are the step's groups in the order the step used them (a failed group, with
    no trajectories, has no rows but keeps its place in the ``group`` numbering). Advantages are
    computed as training computes them (``baseline``, ``normalize_std``); a group whose members
    all got the same reward is marked ``trained = False`` (training drops it), unless
    ``keep_constant`` (a run with a distillation teacher trains every group). The loop over
    transitions is per turn, never per token: each column is built from numpy arrays (one
    concatenation plus offsets per list column).

    Example::

        table = rollouts_to_table(0, await rollout_batch(builders_P, policy, RolloutConfig()))
        table.column("ac_tokens")[0].as_py()
    """
    scored = [(p, r) for p, r in enumerate(rollouts_P) if r.group is not None]
    groups = [r.group for _, r in scored if r.group is not None]
    advantages_P = (
        compute_advantages(groups, baseline=baseline, normalize_std=normalize_std) if groups else []
    )
    # The same test as training's remove_constant_reward_groups.
    rewards_PG, offsets_P1 = _core.total_rewards(groups)
    constant_P: list[bool] = _core.constant_groups(rewards_PG, offsets_P1).tolist() if groups else []
    ints: dict[str, list[int]] = {
        k: [] for k in ("sampler_version", "group", "batch_group", "member", "turn", "ob_opaque")
    }
    ob_parts: list[Int32Array] = []
    ac_parts: list[Int32Array] = []
    lp_parts: list[Float32Array] = []
    lp_null: list[bool] = []
    episode_ids: list[str] = []
    prompt_ids: list[str] = []
    extends: list[bool] = []
    stop_reasons: list[str] = []
    rewards: list[float] = []
    done: list[bool] = []
    masked: list[bool] = []
    metrics: list[str] = []
    totals: list[float] = []
    finals: list[float] = []
    advantages: list[float] = []
    trained: list[bool] = []
    end_reasons: list[str] = []
    episode_metrics: list[str] = []
    tags: list[list[str]] = []
    seeds: list[int | None] = []
    for (p, rollout), group, adv_G, constant in zip(scored, groups, advantages_P, constant_P, strict=True):
        totals_G = group.get_total_rewards()
        is_trained = keep_constant or not constant
        group_tags = [str(t) for t in rollout.tags]
        for g, traj in enumerate(group.trajectories_G):
            episode_id = f"s{step}-p{p}-g{g}"
            ep_metrics = json.dumps(dict(group.metrics_G[g]), sort_keys=True)
            prompt_id = ""
            prev: Int32Array | None = None
            end_reason = rollout.end_reasons_G[g] if g < len(rollout.end_reasons_G) else "done"
            for t, tr in enumerate(traj.transitions):
                ob, opaque = _ob_tokens(tr.ob)
                ac = np.asarray(tr.ac.tokens, dtype=np.int32)
                if t == 0:
                    prompt_id = _prompt_id(ob)
                    extends.append(False)
                else:
                    assert prev is not None
                    extends.append(len(ob) >= len(prev) and bool(np.array_equal(ob[: len(prev)], prev)))
                prev = np.concatenate([ob, ac])
                ob_parts.append(ob)
                ac_parts.append(ac)
                lps = tr.ac.maybe_logprobs
                lp_null.append(lps is None)
                lp_parts.append(np.zeros(0, np.float32) if lps is None else np.asarray(lps, dtype=np.float32))
                ints["sampler_version"].append(rollout.version)
                ints["group"].append(p)
                ints["batch_group"].append(rollout.index)
                ints["member"].append(g)
                ints["turn"].append(t)
                ints["ob_opaque"].append(opaque)
                episode_ids.append(episode_id)
                prompt_ids.append(prompt_id)
                stop_reasons.append(str(tr.ac.stop_reason))
                rewards.append(float(tr.reward))
                done.append(t == len(traj.transitions) - 1)
                masked.append(bool(tr.masked))
                metrics.append(json.dumps(dict(tr.metrics), sort_keys=True))
                totals.append(float(totals_G[g]))
                finals.append(float(group.final_rewards_G[g]))
                advantages.append(float(adv_G[g]) if is_trained else 0.0)
                trained.append(is_trained)
                end_reasons.append(str(end_reason))
                episode_metrics.append(ep_metrics)
                tags.append(group_tags)
                seeds.append(rollout.seed)
    n = len(ob_parts)
    columns: dict[str, pa.Array] = {
        "step": pa.array(np.full(n, step, dtype=np.int32)),
        "sampler_version": pa.array(np.asarray(ints["sampler_version"], dtype=np.int32)),
        "group": pa.array(np.asarray(ints["group"], dtype=np.int32)),
        "batch_group": pa.array(np.asarray(ints["batch_group"], dtype=np.int32)),
        "member": pa.array(np.asarray(ints["member"], dtype=np.int32)),
        "episode_id": pa.array(episode_ids, type=pa.string()),
        "prompt_id": pa.array(prompt_ids, type=pa.string()),
        "turn": pa.array(np.asarray(ints["turn"], dtype=np.int32)),
        "ob_tokens": _list_array(ob_parts, pa.int32()),
        "ob_opaque": pa.array(np.asarray(ints["ob_opaque"], dtype=np.int32)),
        "ob_extends": pa.array(extends, type=pa.bool_()),
        "ac_tokens": _list_array(ac_parts, pa.int32()),
        "ac_logprobs": _list_array(lp_parts, pa.float32(), lp_null),
        "stop_reason": pa.array(stop_reasons, type=pa.string()),
        "reward": pa.array(np.asarray(rewards, dtype=np.float64)),
        "episode_done": pa.array(done, type=pa.bool_()),
        "masked": pa.array(masked, type=pa.bool_()),
        "metrics": pa.array(metrics, type=pa.string()),
        "total_reward": pa.array(np.asarray(totals, dtype=np.float64)),
        "final_reward": pa.array(np.asarray(finals, dtype=np.float64)),
        "advantage": pa.array(np.asarray(advantages, dtype=np.float64)),
        "trained": pa.array(trained, type=pa.bool_()),
        "end_reason": pa.array(end_reasons, type=pa.string()),
        "episode_metrics": pa.array(episode_metrics, type=pa.string()),
        "tags": pa.array(tags, type=pa.list_(pa.string())),
        "seed": pa.array(seeds, type=pa.int64()),
    }
    return pa.Table.from_arrays([columns[f.name] for f in TRAJECTORY_SCHEMA], schema=TRAJECTORY_SCHEMA)


# ------------------------------------------------------------------------------ table → text


def table_to_text_records(table: pa.Table, tokenizer: Tokenizer) -> list[dict[str, object]]:
    """The language format: one record per episode of ``table`` (rows in episode, turn order).

    A turn whose observation extends the previous turn's observation and action
    (``ob_extends``) shows only the new part (``"continues": true``), so ``text`` reads as the
    transcript the model saw. Decoding is per turn.

    Example::

        records = table_to_text_records(read_trajectories("runs/rl"), tokenizer)
        print(records[0]["text"], records[0]["total_reward"])
    """
    cols = {
        k: table.column(k).to_pylist()
        for k in (
            "step", "group", "member", "episode_id", "prompt_id", "sampler_version", "tags",
            "total_reward", "advantage", "turn", "ob_extends", "reward", "masked",
        )
    }  # fmt: skip
    ob_flat, ob_off = _flat(table.column("ob_tokens"))
    ac_flat, ac_off = _flat(table.column("ac_tokens"))
    records: list[dict[str, object]] = []
    current: dict[str, object] | None = None
    turns: list[dict[str, object]] = []
    text: list[str] = []
    prev_len = 0
    for r in range(table.num_rows):
        if cols["turn"][r] == 0 or current is None or cols["episode_id"][r] != current["episode_id"]:
            current = {
                k: cols[k][r]
                for k in (
                    "step", "group", "member", "episode_id", "prompt_id", "sampler_version", "tags",
                    "total_reward", "advantage",
                )
            }  # fmt: skip
            turns, text = [], []
            current["turns"] = turns
            records.append(current)
            prev_len = 0
        ob = ob_flat[ob_off[r] : ob_off[r + 1]]
        ac = ac_flat[ac_off[r] : ac_off[r + 1]]
        continues = bool(cols["ob_extends"][r])
        ob_text = decode_text(tokenizer, ob[prev_len:].tolist() if continues else ob.tolist())
        ac_text = decode_text(tokenizer, ac.tolist())
        prev_len = len(ob) + len(ac)
        turns.append(
            {
                "turn": cols["turn"][r],
                "observation": ob_text,
                "continues": continues,
                "action": ac_text,
                "reward": cols["reward"][r],
                "masked": cols["masked"][r],
            }
        )
        text.append(ob_text if continues or not text else "\n" + ob_text)
        text.append(ac_text)
        current["text"] = "".join(text)
    return records


def _flat(column: pa.ChunkedArray | pa.Array) -> tuple[npt.NDArray[np.int32], Int64Array]:
    """A list column's values (numpy) and row offsets ``[rows + 1]``, whatever its chunking and
    slicing."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = arr.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = arr.flatten().to_numpy(zero_copy_only=False)
    return values, offsets


# ------------------------------------------------------------------------------ writing


def _write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write through ``write(file)`` to a hidden temporary file beside ``path``, sync, rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the log is for reading
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@attrs.frozen
class StepLog:
    """What :meth:`TrajectoryLog.write_step` wrote: the part files, their rows and episodes."""

    parquet: Path
    text: Path | None
    n_rows: int
    n_episodes: int
    seconds: float


@attrs.define
class TrajectoryLog:
    """The writer of a run's trajectory log (``<log_dir>/trajectories``); the RL loop owns one
    when ``RLConfig.log_trajectories`` is on.

    ``tokenizer``: decodes the language format (``None``: the RL format only). ``baseline`` and
    ``normalize_std``: how the logged advantages are computed (the run's settings).

    Example::

        log = TrajectoryLog(Path("runs/rl/trajectories"), tokenizer)
        log.start(0)                       # a fresh run: no parts at or after step 0
        log.write_step(0, rollouts_P)      # rl/step-000000.parquet, text/step-000000.jsonl
    """

    root: Path
    tokenizer: Tokenizer | None = None
    baseline: Baseline = "mean"
    normalize_std: bool = False
    keep_constant: bool = False
    """Every group is trained on (a run with a distillation teacher): none is marked untrained."""

    @property
    def rl_dir(self) -> Path:
        return self.root / "rl"

    @property
    def text_dir(self) -> Path:
        return self.root / "text"

    def part(self, step: int, kind: str = "rl") -> Path:
        """The file of ``step`` in the RL (``"rl"``) or language (``"text"``) format."""
        if kind == "rl":
            return self.rl_dir / f"step-{step:06d}.parquet"
        return self.text_dir / f"step-{step:06d}.jsonl"

    def start(self, start_step: int) -> None:
        """Prepare for a run that continues with ``start_step``: create the directories, remove
        leftover temporary files and every part of a step ``>= start_step`` (a resumed run
        writes them again; a run started afresh, ``start_step == 0``, leaves no old parts)."""
        for d in (self.rl_dir, self.text_dir):
            d.mkdir(parents=True, exist_ok=True)
            for f in d.iterdir():
                m = _PART.match(f.name)
                if (f.name.startswith(".") and f.name.endswith(".tmp")) or (
                    m and int(m.group(1)) >= start_step
                ):
                    f.unlink(missing_ok=True)

    def write_step(self, step: int, rollouts_P: Sequence[GroupRollout]) -> StepLog:
        """Write (or rewrite) step ``step``'s parts, atomically; thread-safe for distinct steps."""
        t0 = time.perf_counter()
        table = rollouts_to_table(
            step,
            rollouts_P,
            baseline=self.baseline,
            normalize_std=self.normalize_std,
            keep_constant=self.keep_constant,
        )
        self.rl_dir.mkdir(parents=True, exist_ok=True)
        path = self.part(step)
        _write_atomic(path, lambda f: pq.write_table(table, f))
        text_path: Path | None = None
        n_episodes = int(table.column("episode_done").to_numpy().sum())
        if self.tokenizer is not None:
            tokenizer = self.tokenizer
            self.text_dir.mkdir(parents=True, exist_ok=True)
            text_path = self.part(step, "text")
            lines = "".join(
                json.dumps(r, ensure_ascii=False) + "\n" for r in table_to_text_records(table, tokenizer)
            )
            _write_atomic(text_path, lambda f: f.write(lines.encode("utf-8")))
        return StepLog(path, text_path, table.num_rows, n_episodes, time.perf_counter() - t0)


# ------------------------------------------------------------------------------ reading


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
    if _VERSION_KEY not in meta:
        raise TrajectoryLogError(
            f"{path}: not a tempering trajectory log (no {_VERSION_KEY.decode()!r} in its metadata)"
        )
    version = meta[_VERSION_KEY].decode()
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
