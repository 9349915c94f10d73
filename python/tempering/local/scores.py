"""The sampler's optional logprob outputs, as the ``tinker`` SDK names them:

- ``topk_prompt_logprobs=k``: at each prompt position ``i >= 1``, the ``k`` most likely tokens
  of the model's distribution given ``prompt[:i]`` and their logprobs (row 0, which has no
  context, is empty);
- ``topk_sample_logprobs=k``: at each sampled position, the ``k`` most likely tokens of the
  distribution the token was drawn from (the one whose logprob ``SampledSequence.logprobs``
  holds: temperature, top-k and top-p applied; the model's own at temperature 0);
- ``target_prompt_logprobs``: an int64 ``[len(prompt) - 1, K]`` tensor of token ids (``-1``:
  nothing asked), dense or sparse CSR; row ``i`` is scored at prompt position ``i + 1``. The
  answer is a float32 tensor of the same shape and layout, 0.0 where nothing was asked.

Top-K rows are :class:`tinker.types.TopkLogprobs` matrices, best first; a slot with no token
(a token of probability 0 under top-k/top-p sampling, or the empty row 0) holds the SDK's
sentinel, token 0 with logprob ``-99999.0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tinker
import torch
from tinker.types.topk_logprobs import MASK_LOGPROB, TopkLogprobs

__all__ = [
    "MASK_LOGPROB",
    "PromptScores",
    "ScoreRequest",
    "TargetIds",
    "TopkBuffer",
    "check_topk",
    "dense_from_csr",
    "prompt_logprobs_of",
    "prompt_target_logprobs",
    "prompt_topk",
    "target_ids",
    "topk_of",
]


def dense_from_csr(
    values: np.ndarray,
    crow: np.ndarray,
    col: np.ndarray,
    shape: Sequence[int],
    pad: float,
    where: str,
) -> np.ndarray:
    """A sparse CSR tensor (the SDK's ``TensorData.from_torch_sparse``) as a dense 2-D array whose
    unlisted cells hold ``pad``. Raises ``ValueError`` naming ``where`` and the first problem."""
    if len(shape) != 2 or any(int(s) < 0 for s in shape):
        raise ValueError(f"{where}: a sparse CSR tensor is 2-D with a shape, got shape {list(shape)}")
    rows, cols = int(shape[0]), int(shape[1])
    nnz = len(values)
    if len(crow) != rows + 1:
        raise ValueError(
            f"{where}: sparse CSR row pointers: {len(crow)} of them for {rows} rows (need rows + 1)"
        )
    if len(col) != nnz:
        raise ValueError(f"{where}: sparse CSR tensor has {nnz} values but {len(col)} column indices")
    steps = np.diff(crow)
    if crow[0] != 0 or crow[-1] != nnz or (steps < 0).any():
        raise ValueError(
            f"{where}: sparse CSR row pointers must rise from 0 to the number of values ({nnz}), "
            f"got {crow[:8].tolist()}{' ...' if len(crow) > 8 else ''}"
        )
    if nnz and (col.min() < 0 or col.max() >= cols):
        bad = int(col.min()) if col.min() < 0 else int(col.max())
        raise ValueError(
            f"{where}: sparse CSR column index {bad} is out of range for shape {[rows, cols]} "
            f"(columns 0..{cols - 1})"
        )
    row_of = np.repeat(np.arange(rows), steps)
    if nnz > 1 and not ((col[1:] > col[:-1]) | (row_of[1:] != row_of[:-1])).all():
        raise ValueError(f"{where}: sparse CSR column indices must increase within each row")
    out = np.full((rows, cols), pad, dtype=values.dtype)
    out[row_of, col] = values
    return out


def check_topk(name: str, k: int, vocab_size: int) -> int:
    """``k`` as a top-K width: an integer in ``[0, vocab_size]`` (0: not asked for)."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"{name} must be an integer, got {k!r}")
    k = int(k)
    if k < 0:
        raise ValueError(f"{name} must be >= 0, got {k}")
    if k > vocab_size:
        raise ValueError(f"{name}={k} is larger than the model's vocabulary ({vocab_size} tokens)")
    return k


@dataclass(frozen=True)
class TargetIds:
    """A checked ``target_prompt_logprobs`` request: the ids ``[len(prompt) - 1, K]`` (``-1``:
    nothing asked) and, for a sparse request, its layout (the answer keeps it)."""

    ids: np.ndarray
    crow: list[int] | None = None
    col: list[int] | None = None

    def answer(self, logprobs: np.ndarray) -> tinker.TensorData:
        """The logprobs ``[len(prompt) - 1, K]`` as the SDK's answer: float32, 0.0 where the
        request had ``-1``, sparse CSR with the request's cells if the request was sparse."""
        values = np.where(self.ids >= 0, logprobs, 0.0).astype(np.float32)
        shape = list(self.ids.shape)
        if self.crow is None or self.col is None:
            return tinker.TensorData(data=values.reshape(-1), dtype="float32", shape=shape)
        row_of = np.repeat(np.arange(shape[0]), np.diff(np.asarray(self.crow, dtype=np.int64)))
        listed = values[row_of, np.asarray(self.col, dtype=np.int64)]
        return tinker.TensorData(
            data=listed,
            dtype="float32",
            shape=shape,
            sparse_crow_indices=list(self.crow),
            sparse_col_indices=list(self.col),
        )


def target_ids(target: tinker.TensorData, prompt_length: int, vocab_size: int) -> TargetIds:
    """Check ``target_prompt_logprobs`` against the prompt and vocabulary (``ValueError``)."""
    name = "target_prompt_logprobs"
    if not isinstance(target, tinker.TensorData):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"{name} must be a tinker.TensorData, got {type(target).__name__}")
    if target.dtype != "int64":
        raise ValueError(f"{name} must be an int64 tensor of token ids, got {target.dtype}")
    shape = list(target.shape) if target.shape is not None else list(target.to_numpy().shape)
    if len(shape) != 2 or shape[0] != prompt_length - 1:
        raise ValueError(
            f"{name} must have shape [len(prompt) - 1, K] = [{prompt_length - 1}, K], got {shape}"
        )
    crow: list[int] | None = None
    col: list[int] | None = None
    if target.sparse_crow_indices is not None:
        if target.sparse_col_indices is None:
            raise ValueError(f"{name}: sparse_crow_indices given without sparse_col_indices")
        crow, col = list(target.sparse_crow_indices), list(target.sparse_col_indices)
        values = np.asarray(target.data, dtype=np.int64)
        ids = dense_from_csr(
            values, np.asarray(crow, dtype=np.int64), np.asarray(col, dtype=np.int64), shape, -1, name
        )
    else:
        ids = np.asarray(target.to_numpy(), dtype=np.int64).reshape(shape)
    asked = ids[ids != -1]
    if asked.size == 0:
        raise ValueError(f"{name} names no token id (every cell is -1)")
    if asked.min() < 0 or asked.max() >= vocab_size:
        bad = int(asked.min()) if asked.min() < 0 else int(asked.max())
        raise ValueError(
            f"{name}: token id {bad} is outside the vocabulary [0, {vocab_size}) (use -1 for no id)"
        )
    return TargetIds(ids=ids, crow=crow, col=col)


def topk_of(logp_N_V: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` best tokens of each row of logprobs, best first: ids (int32) and logprobs
    (float32), ``[N, k]``; a slot whose logprob is ``-inf`` holds the SDK's empty sentinel."""
    values, ids = logp_N_V.topk(k, dim=-1)
    empty = torch.isneginf(values)
    values = values.masked_fill(empty, MASK_LOGPROB)
    ids = ids.masked_fill(empty, 0)
    return ids.to(torch.int32), values.float()


@dataclass(frozen=True)
class ScoreRequest:
    """The extra outputs one sampling request asks for (0 / None: not asked)."""

    topk_prompt: int = 0
    topk_sample: int = 0
    target: TargetIds | None = None

    @property
    def needs_prompt_logits(self) -> bool:
        """Whether the prefill must keep the logits of every prompt position."""
        return self.topk_prompt > 0 or self.target is not None

    @staticmethod
    def checked(
        vocab_size: int,
        prompt_length: int,
        topk_prompt_logprobs: int,
        topk_sample_logprobs: int,
        target_prompt_logprobs: tinker.TensorData | None,
    ) -> ScoreRequest:
        """Check the SDK's arguments against the model and prompt (``ValueError`` naming them)."""
        return ScoreRequest(
            topk_prompt=check_topk("topk_prompt_logprobs", topk_prompt_logprobs, vocab_size),
            topk_sample=check_topk("topk_sample_logprobs", topk_sample_logprobs, vocab_size),
            target=None
            if target_prompt_logprobs is None
            else target_ids(target_prompt_logprobs, prompt_length, vocab_size),
        )


def prompt_topk(logits_P_V: torch.Tensor, k: int) -> TopkLogprobs:
    """``topk_prompt_logprobs``: ``[P, k]`` rows from the prompt's logits; row 0 is empty."""
    positions = logits_P_V.shape[0]
    ids_np = np.zeros((positions, k), dtype=np.int32)
    lps_np = np.full((positions, k), MASK_LOGPROB, dtype=np.float32)
    if positions > 1:
        ids, lps = topk_of(torch.log_softmax(logits_P_V[:-1].float(), dim=-1), k)
        ids_np[1:] = ids.cpu().numpy()
        lps_np[1:] = lps.cpu().numpy()
    return TopkLogprobs(token_ids=ids_np, logprobs=lps_np)


def prompt_target_logprobs(logits_P_V: torch.Tensor, target: TargetIds) -> tinker.TensorData:
    """``target_prompt_logprobs``: the logprob of each asked id at its prompt position."""
    logp = torch.log_softmax(logits_P_V[:-1].float(), dim=-1)  # row i: position i + 1
    ids = torch.from_numpy(np.clip(target.ids, 0, None)).to(logp.device)
    return target.answer(logp.gather(1, ids).cpu().numpy())


def prompt_logprobs_of(prompt: list[int], logits_P_V: torch.Tensor) -> np.ndarray:
    """Logprob of each prompt token given those before it; NaN for the first."""
    out = np.full(len(prompt), np.nan, dtype=np.float32)
    if len(prompt) > 1:
        logp = torch.log_softmax(logits_P_V[:-1], dim=-1)
        nxt = torch.tensor(prompt[1:], device=logits_P_V.device).unsqueeze(1)
        out[1:] = logp.gather(1, nxt).squeeze(1).cpu().numpy()
    return out


@dataclass(frozen=True)
class PromptScores:
    """What one request asked for about its prompt, from the prefill's logits ``[P, V]``."""

    logprobs: np.ndarray | None
    topk: TopkLogprobs | None
    target: tinker.TensorData | None

    @staticmethod
    def of(prompt: list[int], logits_P_V: torch.Tensor, logprobs: bool, asked: ScoreRequest) -> PromptScores:
        """``logits_P_V``: every prompt position's if ``logprobs`` or ``asked.needs_prompt_logits``."""
        target = asked.target
        return PromptScores(
            logprobs=prompt_logprobs_of(prompt, logits_P_V) if logprobs else None,
            topk=prompt_topk(logits_P_V, asked.topk_prompt) if asked.topk_prompt else None,
            target=prompt_target_logprobs(logits_P_V, target) if target is not None else None,
        )


class TopkBuffer:
    """``topk_sample_logprobs`` of every decoding row and step, ``[N, T, K]`` (K: the widest
    request's); unfilled slots hold the empty sentinel."""

    def __init__(self, rows: int, steps: int, width: int, device: torch.device) -> None:
        self.width = width
        self.ids = torch.zeros((rows, steps, width), dtype=torch.int32, device=device)
        self.logprobs = torch.full((rows, steps, width), MASK_LOGPROB, dtype=torch.float32, device=device)

    def put(self, active: torch.Tensor, t: int, logp_A_V: torch.Tensor) -> None:
        """Step ``t`` of the rows ``active``, from their sampling distributions ``[A, V]``."""
        ids, lps = topk_of(logp_A_V, self.width)
        self.ids[active, t] = ids
        self.logprobs[active, t] = lps

    def numpy(self) -> tuple[np.ndarray, np.ndarray]:
        return self.ids.cpu().numpy(), self.logprobs.cpu().numpy()

    @staticmethod
    def rows(filled: tuple[np.ndarray, np.ndarray] | None, row: int, n: int, k: int) -> TopkLogprobs:
        """One sequence's ``[n, k]`` matrices (``filled``: :meth:`numpy`, None if nothing decoded)."""
        if filled is None or n == 0:
            return TopkLogprobs(token_ids=np.zeros((0, k), np.int32), logprobs=np.zeros((0, k), np.float32))
        ids, lps = filled
        return TopkLogprobs(
            token_ids=np.ascontiguousarray(ids[row, :n, :k]),
            logprobs=np.ascontiguousarray(lps[row, :n, :k]),
        )
