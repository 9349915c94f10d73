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

The RL format (``TRAJECTORY_SCHEMA``, one row per transition) and reading it back are in
:mod:`tempering.rl.trajectory_files`.

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
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import attrs
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
import tinker
from tinker.types import EncodedTextChunk

from tempering import _core
from tempering.arrays import Float32Array, Int32Array, Int64Array
from tempering.rl.data import Baseline, compute_advantages
from tempering.rl.rollouts import GroupRollout
from tempering.rl.trajectory_files import (
    PART,
    SCHEMA_VERSION,
    TRAJECTORY_SCHEMA,
    TrajectoryLogError,
    episodes_table,
    read_trajectories,
    trajectory_parts,
)
from tempering_protocols import Tokenizer
from tempering_protocols.rendering import decode_text
from tempering_protocols.rl import metrics_mask_turn

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
                masked.append(bool(tr.masked) or metrics_mask_turn(tr.metrics))
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
                m = PART.match(f.name)
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
