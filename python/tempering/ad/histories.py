"""Learning histories: a source learner run on many tasks, logged in tempering's trajectory log
format (:mod:`tempering.rl.trajectory_files`), and read back checked.

Layout: ``<dir>/trajectories/rl/step-<task>.parquet``, one part per task (the part number is the
task's index, so reading the parts in order gives the rows in (task, episode, step) order across
the whole source run). Columns as the RL format defines them, with:

=================  ============================================================================
column             in a learning history
=================  ============================================================================
``group``          the task's index (``batch_group`` too)
``step``           the source learner's episode on that task (``0..E-1``)
``turn``           the step within the episode (``0..H-1``)
``ob_tokens``      ``[state]``
``ac_tokens``      ``[action]``
``ac_logprobs``    ``[log-probability of the action under the learner]``
``prompt_id``      ``"<family>/<split>/<task seed>"``: every row of a task shares it
``episode_id``     ``"t<task>-e<episode>"``
``seed``           the task's seed
=================  ============================================================================

Shapes: ``R`` rows (transitions), ``E`` episodes, ``N`` tasks.

Example::

    write_histories(DarkRoomFamily(), "runs/ad/histories", n_tasks=50, n_episodes=40, seed=0)
    h = read_histories("runs/ad/histories")    # checked: no gap, duplicate or mixed task
    h.returns_NE()                             # per-task, per-episode source returns
"""

# pyarrow ships no type information: its tables, arrays and types are Unknown to the checker.
# pyright: reportUnknownParameterType=false, reportUnknownMemberType=false, reportUnknownVariableType=false
# pyright: reportUnknownArgumentType=false

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from tempering.arrays import Float32Array, Int64Array
from tempering.rl.trajectory_files import (
    TRAJECTORY_SCHEMA,
    TrajectoryLogError,
    read_trajectories,
    trajectory_parts,
)
from tempering_protocols import InContextTaskFamily

__all__ = [
    "HistoryError",
    "LearningHistories",
    "SourceRun",
    "read_histories",
    "run_source",
    "write_histories",
    "write_task",
]


class HistoryError(TrajectoryLogError):
    """A learning history that cannot be served: a gap, a duplicated step, rows of two tasks
    interleaved, or a row that is not one state and one action. The message names file and row."""


@attrs.frozen
class SourceRun:
    """One source learner's run on one task: per-row arrays (``_R``)."""

    episode_R: Int64Array
    turn_R: Int64Array
    state_R: Int64Array
    action_R: Int64Array
    reward_R: Float32Array
    logprob_R: Float32Array
    done_R: npt.NDArray[np.bool_]


def run_source(family: InContextTaskFamily, seed: int, n_episodes: int, *, held_out: bool) -> SourceRun:
    """Run ``family``'s source learner on task ``seed`` for ``n_episodes`` episodes.

    Example::

        run = run_source(BanditFamily(), 3, 100, held_out=True)
        run.reward_R.sum()
    """
    task = family.task(seed, held_out)
    learner = family.learner(task, seed)
    h = family.horizon
    rows = n_episodes * h
    state_R = np.zeros(rows, dtype=np.int64)
    action_R = np.zeros(rows, dtype=np.int64)
    reward_R = np.zeros(rows, dtype=np.float32)
    logprob_R = np.zeros(rows, dtype=np.float32)
    i = 0
    for _ in range(n_episodes):
        state = task.reset()
        for t in range(h):
            action, logprob = learner.act(state)
            next_state, reward = task.step(action)
            learner.update(state, action, reward, next_state, t == h - 1)
            state_R[i], action_R[i], reward_R[i], logprob_R[i] = state, action, reward, logprob
            state = next_state
            i += 1
    episode_R = np.repeat(np.arange(n_episodes, dtype=np.int64), h)
    turn_R = np.tile(np.arange(h, dtype=np.int64), n_episodes)
    return SourceRun(episode_R, turn_R, state_R, action_R, reward_R, logprob_R, turn_R == h - 1)


def _singletons(values: npt.NDArray[np.generic], dtype: pa.DataType) -> pa.ListArray:
    offsets = pa.array(np.arange(len(values) + 1, dtype=np.int32), type=pa.int32())
    return pa.ListArray.from_arrays(offsets, pa.array(values, type=dtype), type=pa.list_(dtype))


def _table(family: InContextTaskFamily, index: int, seed: int, split: str, run: SourceRun) -> pa.Table:
    n = len(run.state_R)
    totals_E = np.bincount(run.episode_R, weights=run.reward_R)
    const = {"task": index, "seed": seed, "family": family.name, "split": split}

    def full(value: object, dtype: pa.DataType) -> pa.Array:
        return pa.array([value] * n, type=dtype)

    columns: dict[str, pa.Array] = {
        "step": pa.array(run.episode_R, type=pa.int32()),
        "sampler_version": pa.array(run.episode_R, type=pa.int32()),
        "group": full(index, pa.int32()),
        "batch_group": full(index, pa.int32()),
        "member": full(0, pa.int32()),
        "episode_id": pa.array([f"t{index}-e{e}" for e in run.episode_R.tolist()], type=pa.string()),
        "prompt_id": full(f"{family.name}/{split}/{seed}", pa.string()),
        "turn": pa.array(run.turn_R, type=pa.int32()),
        "ob_tokens": _singletons(run.state_R.astype(np.int32), pa.int32()),
        "ob_opaque": full(0, pa.int32()),
        "ob_extends": full(False, pa.bool_()),
        "ac_tokens": _singletons(run.action_R.astype(np.int32), pa.int32()),
        "ac_logprobs": _singletons(run.logprob_R, pa.float32()),
        "stop_reason": full("stop", pa.string()),
        "reward": pa.array(run.reward_R.astype(np.float64), type=pa.float64()),
        "episode_done": pa.array(run.done_R, type=pa.bool_()),
        "masked": full(False, pa.bool_()),
        "metrics": full("{}", pa.string()),
        "total_reward": pa.array(totals_E[run.episode_R], type=pa.float64()),
        "final_reward": full(0.0, pa.float64()),
        "advantage": full(0.0, pa.float64()),
        "trained": full(False, pa.bool_()),
        "end_reason": full("max_turns", pa.string()),
        "episode_metrics": full(json.dumps(const), pa.string()),
        "tags": pa.array([[f"ad:{family.name}", split]] * n, type=pa.list_(pa.string())),
        "seed": full(seed, pa.int64()),
    }
    return pa.Table.from_arrays([columns[f.name] for f in TRAJECTORY_SCHEMA], schema=TRAJECTORY_SCHEMA)


def write_histories(
    family: InContextTaskFamily,
    out: str | os.PathLike[str],
    *,
    n_tasks: int,
    n_episodes: int,
    seed: int,
    held_out: bool = False,
) -> Path:
    """Run the source learner on ``n_tasks`` tasks (seeds ``seed * 100003 + i``) for ``n_episodes``
    episodes each and write the histories under ``out/trajectories/rl``; returns that directory.

    Example::

        write_histories(BanditFamily(), "runs/ad/histories", n_tasks=200, n_episodes=200, seed=0)
    """
    if n_tasks < 1 or n_episodes < 1:
        raise ValueError(f"write_histories: n_tasks and n_episodes must be >= 1, got {n_tasks}, {n_episodes}")
    rl_dir = Path(out) / "trajectories" / "rl"
    rl_dir.mkdir(parents=True, exist_ok=True)
    for old in rl_dir.glob("step-*.parquet"):
        old.unlink()
    split = "held_out" if held_out else "train"
    for i in range(n_tasks):
        task_seed = seed * 100003 + i
        write_task(
            family, rl_dir, i, task_seed, split, run_source(family, task_seed, n_episodes, held_out=held_out)
        )
    return rl_dir


def write_task(
    family: InContextTaskFamily, rl_dir: Path, index: int, seed: int, split: str, run: SourceRun
) -> Path:
    """Write one task's history (``run``) as part ``index`` of ``rl_dir``, atomically; ``seed`` is
    the task's seed (``family.task(seed, split == "held_out")`` is the task). Returns the part.

    Example::

        write_task(family, rl_dir, 0, 4, "train", run_source(family, 4, 10, held_out=False))
    """
    table = _table(family, index, seed, split, run)
    tmp = rl_dir / f".step-{index:06d}.parquet.tmp"
    pq.write_table(table, tmp)
    part = rl_dir / f"step-{index:06d}.parquet"
    tmp.rename(part)
    return part


@attrs.frozen
class LearningHistories:
    """Checked learning histories: per-row arrays in (task, episode, step) order, and where each
    task's rows start (``starts_N1``: ``N + 1`` offsets)."""

    task_R: Int64Array
    episode_R: Int64Array
    state_R: Int64Array
    action_R: Int64Array
    reward_R: Float32Array
    logprob_R: Float32Array
    starts_N1: Int64Array
    horizon: int
    source: str

    @property
    def n_tasks(self) -> int:
        return len(self.starts_N1) - 1

    def returns_NE(self) -> npt.NDArray[np.float64]:
        """The source's return of every episode of every task (tasks × episodes; all tasks have
        the same number of episodes, else ``HistoryError``)."""
        lengths = np.diff(self.starts_N1)
        if len(set(lengths.tolist())) > 1:
            raise HistoryError(f"{self.source}: tasks have different history lengths {sorted(set(lengths))}")
        n_e = int(lengths[0]) // self.horizon
        return self.reward_R.astype(np.float64).reshape(self.n_tasks, n_e, self.horizon).sum(axis=2)


def _check_part(path: Path, table: pa.Table) -> tuple[list[Int64Array], list[Float32Array]]:
    """The part's columns as arrays, after the per-row checks: (group, step, turn, done, state,
    action) and (reward, logprob)."""
    ob_len = table.column("ob_tokens").combine_chunks().value_lengths().to_numpy(zero_copy_only=False)
    ac_len = table.column("ac_tokens").combine_chunks().value_lengths().to_numpy(zero_copy_only=False)
    bad = np.flatnonzero((ob_len != 1) | (ac_len != 1))
    if len(bad):
        r = int(bad[0])
        raise HistoryError(
            f"{path}: row {r}: {int(ob_len[r])} observation and {int(ac_len[r])} action tokens; a "
            "learning history holds one state and one action per row (write it with write_histories)"
        )
    lp = table.column("ac_logprobs").combine_chunks()
    logprob_R = np.zeros(table.num_rows, dtype=np.float32)
    lp_len = lp.value_lengths().to_numpy(zero_copy_only=False)
    has = np.flatnonzero(np.nan_to_num(lp_len, nan=0) == 1)
    if len(has):
        logprob_R[has] = lp.take(pa.array(has)).flatten().to_numpy()

    def col(name: str) -> Int64Array:
        return table.column(name).to_numpy().astype(np.int64)

    state_R = table.column("ob_tokens").combine_chunks().flatten().to_numpy().astype(np.int64)
    action_R = table.column("ac_tokens").combine_chunks().flatten().to_numpy().astype(np.int64)
    reward_R = table.column("reward").to_numpy().astype(np.float32)
    done_R = table.column("episode_done").to_numpy(zero_copy_only=False).astype(np.int64)
    return [col("group"), col("step"), col("turn"), done_R, state_R, action_R], [reward_R, logprob_R]


def read_histories(path: str | os.PathLike[str]) -> LearningHistories:
    """The learning histories at ``path`` (a directory :func:`write_histories` wrote, its
    ``trajectories/rl``, or one part), checked: each task's rows contiguous (rows of two tasks
    interleaved would mix tasks in a window), episodes ``0, 1, …`` and steps ``0, 1, …`` with
    no gap and no duplicate, every episode the same length, the last one complete. Raises
    :class:`HistoryError` naming the file and the row.

    Example::

        h = read_histories("runs/ad/histories")
        h.n_tasks, h.returns_NE().mean(axis=0)
    """
    parts = trajectory_parts(path)
    arrays: list[tuple[list[Int64Array], list[Float32Array]]] = []
    where: list[tuple[Path, int]] = []  # (file, row in file) of each part's first row
    for part in parts:
        table = read_trajectories(part)
        arrays.append(_check_part(part, table))
        where.append((part, table.num_rows))
    if not arrays or sum(n for _, n in where) == 0:
        raise HistoryError(f"{path}: no rows (an empty learning history)")
    task_R, episode_R, turn_R, done_R, state_R, action_R = (
        np.concatenate([a[0][k] for a in arrays]) for k in range(6)
    )
    reward_R, logprob_R = (np.concatenate([a[1][k] for a in arrays]) for k in range(2))
    ends = np.cumsum([n for _, n in where])

    def locate(r: int) -> str:
        k = int(np.searchsorted(ends, r, side="right"))
        first = 0 if k == 0 else int(ends[k - 1])
        return f"{where[k][0]}: row {r - first}"

    n = len(task_R)
    new_task = np.ones(n, dtype=bool)
    new_task[1:] = task_R[1:] != task_R[:-1]
    task_firsts = task_R[new_task]
    seen, counts = np.unique(task_firsts, return_counts=True)
    if (counts > 1).any():
        t = int(seen[counts > 1][0])
        r = int(np.flatnonzero(new_task & (task_R == t))[1])
        raise HistoryError(
            f"{locate(r)}: task {t} again after rows of another task; each task's history must be "
            "one run of rows (rows of two tasks interleaved would mix tasks in one window)"
        )
    # the expected (episode, turn) of each row from the row before it
    exp_ep = np.zeros(n, dtype=np.int64)
    exp_turn = np.zeros(n, dtype=np.int64)
    exp_ep[1:] = episode_R[:-1] + done_R[:-1]
    exp_turn[1:] = np.where(done_R[:-1] == 1, 0, turn_R[:-1] + 1)
    exp_ep[new_task] = 0
    exp_turn[new_task] = 0
    wrong = np.flatnonzero((exp_ep != episode_R) | (exp_turn != turn_R))
    if len(wrong):
        r = int(wrong[0])
        same = r > 0 and not new_task[r] and episode_R[r] == episode_R[r - 1] and turn_R[r] == turn_R[r - 1]
        kind = (
            "duplicated step"
            if same
            else "gap"
            if (episode_R[r], turn_R[r]) > (exp_ep[r], exp_turn[r])
            else "step out of order"
        )
        raise HistoryError(
            f"{locate(r)}: {kind} in task {int(task_R[r])}'s history: episode {int(episode_R[r])} step "
            f"{int(turn_R[r])}, expected episode {int(exp_ep[r])} step {int(exp_turn[r])}"
        )
    last = np.flatnonzero(np.append(new_task[1:], True))
    unfinished = last[done_R[last] == 0]
    if len(unfinished):
        r = int(unfinished[0])
        raise HistoryError(
            f"{locate(r)}: task {int(task_R[r])}'s last episode is not complete (no episode_done)"
        )
    lengths = turn_R[done_R == 1] + 1
    if len(set(lengths.tolist())) != 1:
        r = int(np.flatnonzero(done_R == 1)[np.flatnonzero(lengths != lengths[0])[0]])
        raise HistoryError(
            f"{locate(r)}: an episode of {int(turn_R[r]) + 1} steps; every episode must have "
            f"{int(lengths[0])} (the task's horizon)"
        )
    starts = np.append(np.flatnonzero(new_task), n).astype(np.int64)
    return LearningHistories(
        task_R, episode_R, state_R, action_R, reward_R, logprob_R, starts, int(lengths[0]), str(path)
    )
