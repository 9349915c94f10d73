"""Trajectory logs back into supervised data: rejection sampling and learning histories.

The input is a trajectory table (:func:`~tempering.rl.trajectories.read_trajectories`: one row
per transition, the rows of an episode together and in turn order). Tokens are the ground truth:
a supervised sequence is rebuilt from the logged observation and action tokens, with weight 1 on
action tokens (0 on a masked turn's) and 0 on everything else, exactly as the RL step packed
it (a turn whose observation extends the previous observation and action, ``ob_extends``,
adds only its new tokens; any other turn starts a new sequence).

=====================================  ============================================================
function                               what
=====================================  ============================================================
:func:`select_episodes`                keep episodes by total reward, the top ``k`` per prompt,
                                       without duplicates (``pyarrow.compute`` filters, numpy ranks)
:func:`trajectory_examples`            each kept episode → ``SupervisedExample`` (rejection-sampling
                                       fine-tuning, RFT)
:func:`learning_history_examples`      per prompt (or task), episodes in training-step order,
                                       concatenated with each attempt's reward shown between them
                                       (algorithm distillation)
:func:`supervised_dataset`             examples → a ``SupervisedDataset`` of datums for
                                       :func:`tempering.sft.train_supervised`
=====================================  ============================================================

Sequences are assembled on flat arrays (numpy gathers over the list columns' values and
offsets); the Python loops run once per episode or per output example, never per token.

Shapes (docs/notation.md): ``R`` rows (transitions) of a table, ``E`` episodes, ``S`` output
sequences, ``N`` tokens of all sequences, ``T`` one sequence's tokens.

Example::

    table = read_trajectories("runs/demo/rl")
    best = select_episodes(table, min_reward=1.0, top_k_per_prompt=1, dedup=True)
    examples = trajectory_examples(best)
    train = supervised_dataset(examples, batch_size=32)
    await train_supervised(config, run=run, model=model, adam=adam, train=train)
"""

# pyarrow ships no type information: its tables, arrays and types are Unknown to the checker.
# pyright: reportUnknownParameterType=false

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import tinker

from tempering.arrays import Int64Array
from tempering.data import BatchedDataset
from tempering.data.datums import examples_to_datums
from tempering.rl.trajectories import TrajectoryLogError, _flat
from tempering_protocols import SupervisedExample, Tokenizer

__all__ = [
    "HistoryKey",
    "learning_history_examples",
    "select_episodes",
    "supervised_dataset",
    "trajectory_examples",
]

HistoryKey: TypeAlias = Literal["prompt", "tags"]
"""What one learning history follows: one prompt (``prompt_id``), or one task (the group's tags)."""


# ------------------------------------------------------------------------------ episodes


def _episode_spans(table: pa.Table) -> tuple[Int64Array, Int64Array]:
    """``(start_E, end_E)``: each episode's rows ``[start, end)``, checked to be in turn order."""
    n = table.num_rows
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    done_R = np.asarray(table.column("episode_done").to_numpy(zero_copy_only=False), dtype=bool)
    turn_R = np.asarray(table.column("turn").to_numpy(zero_copy_only=False), dtype=np.int64)
    end_E = np.flatnonzero(done_R).astype(np.int64) + 1
    start_E = np.concatenate([[0], end_E[:-1]]).astype(np.int64)
    if not done_R[-1] or not np.array_equal(turn_R, np.arange(n) - np.repeat(start_E, end_E - start_E)):
        raise TrajectoryLogError(
            "trajectory table: the rows of each episode must be together, in turn order, and end "
            "with an episode_done row (as read_trajectories returns them)"
        )
    return start_E, end_E


def _ragged_index(starts: Int64Array, lengths: Int64Array) -> Int64Array:
    """Indices of the segments ``[starts[i], starts[i] + lengths[i])``, concatenated."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    seg = np.repeat(np.arange(len(starts), dtype=np.int64), lengths)
    before = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return starts[seg] + (np.arange(total, dtype=np.int64) - before[seg])


def _rank_within(codes_E: Int64Array) -> Int64Array:
    """For rows sorted so equal codes are adjacent: each row's place within its run of codes."""
    n = len(codes_E)
    idx = np.arange(n, dtype=np.int64)
    new = np.ones(n, dtype=bool)
    new[1:] = codes_E[1:] != codes_E[:-1]
    return idx - np.maximum.accumulate(np.where(new, idx, 0))


def _codes(column: pa.ChunkedArray | pa.Array) -> Int64Array:
    """Integer codes of a column's values (equal values, equal codes)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return np.asarray(arr.dictionary_encode().indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def select_episodes(
    table: pa.Table,
    *,
    min_reward: float | None = None,
    top_k_per_prompt: int | None = None,
    dedup: bool = False,
) -> pa.Table:
    """The rows of the episodes to keep, in the table's order.

    ``min_reward``: keep episodes whose total reward is at least this. ``dedup``: of the
    episodes of one prompt with the same action tokens (all turns), keep one. ``top_k_per_prompt``:
    keep the ``k`` best episodes of each prompt (highest total reward; ties go to the later
    training step, then the lower group and member). The filters apply in that order.

    Example::

        best = select_episodes(read_trajectories("runs/rl"), min_reward=1.0, top_k_per_prompt=1)
    """
    if top_k_per_prompt is not None and top_k_per_prompt < 1:
        raise ValueError(f"top_k_per_prompt must be >= 1, got {top_k_per_prompt}")
    start_E, end_E = _episode_spans(table)
    eps = table.take(pa.array(end_E - 1)).select(
        ["episode_id", "prompt_id", "step", "group", "member", "total_reward"]
    )
    eps = eps.append_column("row_start", pa.array(start_E)).append_column("row_end", pa.array(end_E))
    if min_reward is not None:
        eps = eps.filter(pc.field("total_reward") >= min_reward)
    if (dedup or top_k_per_prompt is not None) and eps.num_rows:
        eps = eps.sort_by(
            [("prompt_id", "ascending"), ("total_reward", "descending"), ("step", "descending"),
             ("group", "ascending"), ("member", "ascending")]
        )  # fmt: skip
        if dedup:
            ac_flat, ac_off = _flat(table.column("ac_tokens"))
            starts = eps.column("row_start").to_numpy()
            ends = eps.column("row_end").to_numpy()
            prompts = eps.column("prompt_id").to_pylist()
            seen: set[tuple[str, bytes]] = set()
            keep: list[bool] = []
            for prompt, a, b in zip(prompts, starts.tolist(), ends.tolist(), strict=True):
                key = (prompt, ac_flat[ac_off[a] : ac_off[b]].tobytes())
                keep.append(key not in seen)
                seen.add(key)
            eps = eps.filter(pa.array(keep, type=pa.bool_()))
        if top_k_per_prompt is not None:
            rank_E = _rank_within(_codes(eps.column("prompt_id")))
            eps = eps.filter(pa.array(rank_E < top_k_per_prompt))
    return table.filter(pc.field("episode_id").isin(eps.column("episode_id").combine_chunks()))


# ------------------------------------------------------------------------------ sequences


def _assemble(
    rows: pa.Table,
    seq_R: Int64Array,
    new_R: npt.NDArray[np.bool_],
    feedback: tuple[Int64Array, Int64Array, Int64Array] | None = None,
) -> list[SupervisedExample]:
    """Sequences from rows: row ``r`` joins sequence ``seq_R[r]`` (non-decreasing) with its
    observation (all of it when ``new_R[r]``, else only what extends the previous row's
    observation + action), its action (weight 1 unless masked) and its feedback tokens (weight
    0): ``feedback = (values, start_R, len_R)``, row ``r``'s being ``values[start_R[r]:][:len_R[r]]``."""
    if int(rows.column("ob_opaque").to_numpy().sum()) > 0:
        raise TrajectoryLogError(
            "trajectory table: some observations hold non-token chunks (images), which the log does "
            "not store; such episodes cannot be rebuilt as token sequences"
        )
    ob_flat, ob_off = _flat(rows.column("ob_tokens"))
    ac_flat, ac_off = _flat(rows.column("ac_tokens"))
    n_rows = rows.num_rows
    ob_len = np.diff(ob_off)
    ac_len = np.diff(ac_off)
    prev_len = np.zeros(n_rows, dtype=np.int64)
    prev_len[1:] = ob_len[:-1] + ac_len[:-1]
    skip = np.where(new_R, 0, prev_len)
    if np.any(skip > ob_len):
        raise TrajectoryLogError(
            "trajectory table: an observation marked ob_extends is shorter than its prefix"
        )
    if feedback is None:
        fb_flat, fb_start, fb_len = (
            np.zeros(0, np.int64),
            np.zeros(n_rows, np.int64),
            np.zeros(n_rows, np.int64),
        )
    else:
        fb_flat, fb_start, fb_len = feedback
    buf = np.concatenate([ob_flat.astype(np.int64), ac_flat.astype(np.int64), fb_flat])
    masked = np.asarray(rows.column("masked").to_numpy(zero_copy_only=False), dtype=bool)
    # Three segments per row, in order: new observation tokens, action, feedback.
    starts_R3 = np.stack(
        [ob_off[:-1] + skip, len(ob_flat) + ac_off[:-1], len(ob_flat) + len(ac_flat) + fb_start], axis=1
    )
    lens_R3 = np.stack([ob_len - skip, ac_len, fb_len], axis=1)
    weights_R3 = np.stack([np.zeros(n_rows), np.where(masked, 0.0, 1.0), np.zeros(n_rows)], axis=1)
    lens = lens_R3.ravel()
    tokens_N = buf[_ragged_index(starts_R3.ravel(), lens)]
    weights_N = np.repeat(weights_R3.ravel(), lens).astype(np.float32)
    n_seq = int(seq_R[-1]) + 1 if n_rows else 0
    seq_len = np.bincount(seq_R, weights=lens_R3.sum(axis=1), minlength=n_seq).astype(np.int64)
    offsets_S1 = np.zeros(n_seq + 1, dtype=np.int64)
    np.cumsum(seq_len, out=offsets_S1[1:])
    out: list[SupervisedExample] = []
    for a, b in zip(offsets_S1[:-1].tolist(), offsets_S1[1:].tolist(), strict=True):
        if b - a >= 2:  # a datum needs an input and a target
            out.append(SupervisedExample(tinker.ModelInput.from_ints(tokens_N[a:b].tolist()), weights_N[a:b]))
    return out


def trajectory_examples(rows: pa.Table) -> list[SupervisedExample]:
    """Each episode of ``rows`` as supervised example(s): observation and action tokens as
    logged, weight 1 on action tokens (0 on masked turns). A turn whose observation does not
    extend the previous turn's starts a new example (as the RL step packs it into a new datum).

    Example::

        examples = trajectory_examples(select_episodes(table, min_reward=1.0))
        data_D = examples_to_datums(examples)
    """
    _episode_spans(rows)
    turn_R = rows.column("turn").to_numpy()
    extends_R = np.asarray(rows.column("ob_extends").to_numpy(zero_copy_only=False), dtype=bool)
    new_R = (turn_R == 0) | ~extends_R
    seq_R = np.cumsum(new_R).astype(np.int64) - 1
    return _assemble(rows, seq_R, new_R)


def learning_history_examples(
    table: pa.Table,
    tokenizer: Tokenizer,
    *,
    key: HistoryKey = "prompt",
    episodes_per_history: int = 4,
    per_step: int | None = None,
    feedback: str = "\nreward: {reward:g}\n",
) -> list[SupervisedExample]:
    """Learning histories (algorithm distillation): for each prompt (``key="prompt"``) or task
    (``key="tags"``), its episodes in training order (step, group, member), cut into windows of
    ``episodes_per_history`` episodes; each window is one example: the episodes' tokens one after
    another, each attempt's total reward shown between attempts as ``feedback`` text (encoded
    with ``tokenizer``, weight 0). Weights: 1 on every action token (0 on masked turns), so the
    model learns to imitate the learner's attempts as they improved. ``per_step``: keep at most
    this many episodes of a prompt per step (the first members). The last window of a prompt may
    hold fewer episodes.

    Example::

        examples = learning_history_examples(read_trajectories("runs/rl"), tokenizer,
                                             episodes_per_history=4)
    """
    if episodes_per_history < 1:
        raise ValueError(f"episodes_per_history must be >= 1, got {episodes_per_history}")
    if per_step is not None and per_step < 1:
        raise ValueError(f"per_step must be >= 1, got {per_step}")
    start_E, end_E = _episode_spans(table)
    if len(start_E) == 0:
        return []
    last = table.take(pa.array(end_E - 1))
    if key == "prompt":
        key_col = last.column("prompt_id")
    else:
        key_col = pa.array([",".join(t) for t in last.column("tags").to_pylist()], type=pa.string())
    eps = pa.table(
        {
            "key": _codes(key_col),
            "step": last.column("step"),
            "group": last.column("group"),
            "member": last.column("member"),
            "total_reward": last.column("total_reward"),
            "start": start_E,
            "end": end_E,
        }
    ).sort_by([("key", "ascending"), ("step", "ascending"), ("group", "ascending"), ("member", "ascending")])
    key_E = eps.column("key").to_numpy()
    if per_step is not None:
        rank = _rank_within(
            key_E * (int(eps.column("step").to_numpy().max()) + 1) + eps.column("step").to_numpy()
        )
        eps = eps.filter(pa.array(rank < per_step))
        key_E = eps.column("key").to_numpy()
    window_E = _rank_within(key_E) // episodes_per_history
    new_history = np.ones(len(key_E), dtype=bool)
    new_history[1:] = (key_E[1:] != key_E[:-1]) | (window_E[1:] != window_E[:-1])
    history_E = np.cumsum(new_history).astype(np.int64) - 1
    last_in_history = np.ones(len(key_E), dtype=bool)
    last_in_history[:-1] = new_history[1:]
    # The rows of the episodes, in history order.
    starts = eps.column("start").to_numpy().astype(np.int64)
    n_turns = eps.column("end").to_numpy().astype(np.int64) - starts
    rows = table.take(pa.array(_ragged_index(starts, n_turns)))
    seq_R = np.repeat(history_E, n_turns)
    turn_R = rows.column("turn").to_numpy()
    extends_R = np.asarray(rows.column("ob_extends").to_numpy(zero_copy_only=False), dtype=bool)
    new_R = (turn_R == 0) | ~extends_R
    # Feedback after the last turn of every episode but a history's last: each distinct reward's
    # text is encoded once; rows point into the concatenation.
    unique_U, code_E = np.unique(eps.column("total_reward").to_numpy(), return_inverse=True)
    encoded_U = [
        np.asarray(
            tokenizer.encode(feedback.format(reward=float(r)), add_special_tokens=False), dtype=np.int64
        )
        for r in unique_U.tolist()
    ]
    len_U = np.array([len(e) for e in encoded_U], dtype=np.int64)
    start_U = np.concatenate([[0], np.cumsum(len_U)[:-1]]).astype(np.int64)
    last_row_E = np.cumsum(n_turns) - 1
    fb_start_R = np.zeros(rows.num_rows, dtype=np.int64)
    fb_len_R = np.zeros(rows.num_rows, dtype=np.int64)
    between = ~last_in_history
    fb_start_R[last_row_E[between]] = start_U[code_E[between]]
    fb_len_R[last_row_E[between]] = len_U[code_E[between]]
    values = np.concatenate(encoded_U) if encoded_U else np.zeros(0, np.int64)
    return _assemble(rows, seq_R, new_R, (values, fb_start_R, fb_len_R))


# ------------------------------------------------------------------------------ datasets


def supervised_dataset(
    examples: Sequence[SupervisedExample],
    *,
    batch_size: int,
    seed: int = 0,
    max_length: int | None = None,
) -> BatchedDataset[tinker.Datum]:
    """The examples as a ``SupervisedDataset`` for :func:`tempering.sft.train_supervised`: packed
    once into datums (one Rust call), shuffled each epoch by ``seed``, ``batch_size`` per batch
    (at most the number of examples; the last partial batch is dropped).

    Example::

        train = supervised_dataset(trajectory_examples(best), batch_size=32)
        len(train), train.get_batch(0)[0].loss_fn_inputs["weights"]
    """
    if not examples:
        raise ValueError("no supervised examples: the filters kept no episode")
    data_D = examples_to_datums(examples, max_length=max_length)
    return BatchedDataset(data_D, min(batch_size, len(data_D)), seed=seed)
