"""A small, obviously-correct pure-Python reference for the data core.

Written the way the Tinker Cookbook writes it: flatten each observation into a list of elements
(an int per token, the chunk object itself for a non-token chunk), test prefixes element by
element with ``==``, accumulate plain Python lists, shift at the end. Per-token loops are fine
here; this is the oracle the Rust core is compared with (tests) and the baseline it is timed
against (benchmarks). Nothing outside the tests uses it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import tinker
from tinker.types import EncodedTextChunk, ModelInputChunk, TensorData

from tempering_protocols import Trajectory, TrajectoryGroup

Elem = int | ModelInputChunk


class ReferenceError(ValueError):
    """Input the reference cannot turn into datums."""


def flatten(ob: tinker.ModelInput) -> list[Elem]:
    out: list[Elem] = []
    for chunk in ob.chunks:
        if isinstance(chunk, EncodedTextChunk):
            out.extend(int(t) for t in chunk.tokens)
        else:
            out.append(chunk)
    return out


def elem_len(e: Elem) -> int:
    return 1 if isinstance(e, int) else e.length


def same(a: Elem, b: Elem) -> bool:
    if isinstance(a, int) != isinstance(b, int):
        return False
    return a == b


def is_prefix(seq: list[Elem], ob: list[Elem]) -> bool:
    return len(seq) <= len(ob) and all(same(s, o) for s, o in zip(seq, ob, strict=False))


@dataclass
class RefDatum:
    """One datum, as plain lists."""

    chunks: list[ModelInputChunk]  # the model input
    target_tokens: list[int]
    logprobs: list[float]  # float32 values
    advantages: list[float]
    mask: list[float]
    group_idx: int = 0
    traj_idx: int = 0
    opaque_pos: list[int] = field(default_factory=list[int])
    weights: list[float] = field(default_factory=list[float])


def make_datum(elems: list[Elem], lps: list[float], advs: list[float], masks: list[float]) -> RefDatum:
    """``elems`` and the per-element values of one sequence → a datum (shift by one position)."""
    tokens: list[int] = []
    values: list[tuple[float, float, float]] = []
    for e, lp, a, m in zip(elems, lps, advs, masks, strict=True):
        n = elem_len(e)
        tokens.extend([e] if isinstance(e, int) else [0] * n)
        values.extend([(lp, a, m)] * n)
    if len(tokens) < 2:
        raise ReferenceError("a datum needs at least 2 positions")
    if not isinstance(elems[-1], int):
        raise ReferenceError("the sequence ends with a non-token chunk")
    # Model input: every element but the last token, consecutive ints grouped into a text chunk.
    chunks: list[ModelInputChunk] = []
    run: list[int] = []
    opaque_pos: list[int] = []
    pos = 0
    for e in elems[:-1]:
        if isinstance(e, int):
            run.append(e)
        else:
            if run:
                chunks.append(EncodedTextChunk(tokens=run))
                run = []
            chunks.append(e)
            opaque_pos.append(pos)
        pos += elem_len(e)
    if run:
        chunks.append(EncodedTextChunk(tokens=run))
    return RefDatum(
        chunks=chunks,
        target_tokens=tokens[1:],
        logprobs=[v[0] for v in values[1:]],
        advantages=[v[1] for v in values[1:]],
        mask=[v[2] for v in values[1:]],
        opaque_pos=opaque_pos,
    )


def f32(x: float) -> float:
    return float(np.float32(x))


def trajectory_to_datums(traj: Trajectory, advantage: float) -> list[RefDatum]:
    """The Cookbook's ``trajectory_to_data``, with masked turns."""
    adv = f32(advantage)
    out: list[RefDatum] = []
    seq: list[Elem] = []
    lps: list[float] = []
    advs: list[float] = []
    masks: list[float] = []
    for tr in traj.transitions:
        ob = flatten(tr.ob)
        if not seq:
            delta = ob
        elif is_prefix(seq, ob):
            delta = ob[len(seq) :]
        else:
            out.append(make_datum(seq, lps, advs, masks))
            seq, lps, advs, masks = [], [], [], []
            delta = ob
        ac = [int(t) for t in tr.ac.tokens]
        ac_lps = [] if tr.ac.maybe_logprobs is None else [f32(x) for x in tr.ac.maybe_logprobs]
        if len(ac_lps) != len(ac):
            raise ReferenceError("logprobs length differs from the action's")
        seq += delta + ac
        lps += [0.0] * len(delta) + ac_lps
        advs += [0.0] * len(delta) + [0.0 if tr.masked else adv] * len(ac)
        masks += [0.0] * len(delta) + [0.0 if tr.masked else 1.0] * len(ac)
    if seq:
        out.append(make_datum(seq, lps, advs, masks))
    return out


def trajectories_to_datums(
    groups_P: Sequence[TrajectoryGroup], advantages_P: Sequence[Sequence[float]]
) -> list[RefDatum]:
    out: list[RefDatum] = []
    for p, (group, adv_G) in enumerate(zip(groups_P, advantages_P, strict=True)):
        for g, (traj, adv) in enumerate(zip(group.trajectories_G, adv_G, strict=True)):
            for d in trajectory_to_datums(traj, float(adv)):
                d.group_idx, d.traj_idx = p, g
                out.append(d)
    return out


def to_tinker(d: RefDatum) -> tinker.Datum:
    """A reference datum as a (validated) ``tinker.Datum``."""
    return tinker.Datum(
        model_input=tinker.ModelInput(chunks=d.chunks),
        loss_fn_inputs={
            "target_tokens": TensorData.from_numpy(np.array(d.target_tokens, dtype=np.int64)),
            "logprobs": TensorData.from_numpy(np.array(d.logprobs, dtype=np.float32)),
            "advantages": TensorData.from_numpy(np.array(d.advantages, dtype=np.float32)),
            "mask": TensorData.from_numpy(np.array(d.mask, dtype=np.float32)),
        },
    )


def input_tokens(d: RefDatum) -> list[int]:
    """The model input's positions as tokens (0 inside non-token chunks)."""
    out: list[int] = []
    for c in d.chunks:
        out.extend([int(t) for t in c.tokens] if isinstance(c, EncodedTextChunk) else [0] * c.length)
    return out


def columns(data: Sequence[RefDatum]) -> dict[str, npt.NDArray[np.generic]]:
    """The columnar form of reference datums (what ``RaggedBatch`` holds)."""
    lens = [len(d.target_tokens) for d in data]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])

    def cat(key: str, dtype: type[np.generic]) -> npt.NDArray[np.generic]:
        vals: list[float | int] = [v for d in data for v in getattr(d, key)]
        return np.array(vals, dtype=dtype)

    return {
        "tokens_N": np.array([t for d in data for t in input_tokens(d)], dtype=np.int64),
        "target_tokens_N": cat("target_tokens", np.int64),
        "logprobs_N": cat("logprobs", np.float32),
        "advantages_N": cat("advantages", np.float32),
        "mask_N": cat("mask", np.float32),
        "offsets_D1": offsets,
        "group_idx_D": np.array([d.group_idx for d in data], dtype=np.int64),
        "traj_idx_D": np.array([d.traj_idx for d in data], dtype=np.int64),
    }


# ------------------------------------------------------------------------------ advantages


def compute_advantages(
    groups_P: Sequence[TrajectoryGroup], *, normalize_std: bool = False, baseline: str = "mean"
) -> list[list[float]]:
    out: list[list[float]] = []
    for group in groups_P:
        r = group.get_total_rewards()
        n = len(r)
        if n == 0:
            raise ReferenceError("empty group")
        total = 0.0
        for x in r:
            total += x
        mean = total / n
        if baseline == "mean":
            adv = [x - mean for x in r]
        else:
            adv = [x - (total - x) / (n - 1) for x in r] if n > 1 else [0.0] * n
        if normalize_std:
            var = 0.0
            for x in r:
                var += (x - mean) * (x - mean)
            # math.sqrt is correctly rounded (IEEE 754); x ** 0.5 goes through libm's pow, which
            # may differ in the last bit.
            denom = math.sqrt(var / n) + 1e-6
            adv = [a / denom for a in adv]
        out.append(adv)
    return out


def is_constant(group: TrajectoryGroup) -> bool:
    r = group.get_total_rewards()
    return all(x == r[0] for x in r)


# ------------------------------------------------------------------------------ supervised


def supervised_datum(
    model_input: tinker.ModelInput, weights: Sequence[float], max_length: int | None = None
) -> RefDatum:
    """Right-shifted input, left-shifted targets and weights (in ``RefDatum.weights``).
    Truncation keeps whole elements up to ``max_length`` positions, then drops trailing
    non-token elements (an image is never split and the input must end on a token)."""
    elems = flatten(model_input)
    w = [f32(x) for x in weights]
    total = sum(elem_len(e) for e in elems)
    if len(w) != total:
        raise ReferenceError("weights length differs")
    if max_length is not None and max_length < total:
        kept: list[Elem] = []
        pos = 0
        for e in elems:
            if pos + elem_len(e) > max_length:
                break
            kept.append(e)
            pos += elem_len(e)
        while kept and not isinstance(kept[-1], int):
            kept.pop()
        elems = kept
    if not elems:
        raise ReferenceError("a datum needs at least 2 positions")
    zeros = [0.0] * len(elems)
    d = make_datum(elems, zeros, zeros, zeros)
    d.weights = w[1 : sum(elem_len(e) for e in elems)]
    return d


def kl_penalty(
    logprobs_D: Sequence[Sequence[float]],
    ref_D: Sequence[Sequence[float]],
    mask_D: Sequence[Sequence[float]],
    adv_D: Sequence[Sequence[float]],
    coef: float,
    discount: float,
) -> tuple[list[list[float]], float]:
    diffs = [
        [m * (lp - r) if m != 0.0 else 0.0 for lp, r, m in zip(lps, rs, ms, strict=True)]
        for lps, rs, ms in zip(logprobs_D, ref_D, mask_D, strict=True)
    ]
    sum_d = 0.0
    sum_m = 0.0
    for ds, ms in zip(diffs, mask_D, strict=True):
        for d, m in zip(ds, ms, strict=True):
            if m != 0.0:
                sum_d += d
                sum_m += m
    mean = sum_d / sum_m if sum_m > 0 else 0.0
    out: list[list[float]] = []
    for ds, ms, advs in zip(diffs, mask_D, adv_D, strict=True):
        new = [0.0] * len(ds)
        acc = 0.0
        for t in reversed(range(len(ds))):
            k = coef * ms[t] * (mean - ds[t])
            acc = k + discount * acc if discount > 0 else k
            new[t] = f32(advs[t] + acc)
        out.append(new)
    return out, mean
