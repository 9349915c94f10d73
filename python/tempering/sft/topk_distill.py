"""Off-policy distillation on a teacher's top-K: the teacher's ``K`` most likely next tokens at
every position of a fixed sequence, as soft targets of a ``[T, K]`` cross-entropy.

Shapes (docs/notation.md): ``T`` tokens of a sequence, ``K`` teacher tokens per position.

=================  ==========  ==================================================================
symbol             shape       meaning
=================  ==========  ==================================================================
``tokens_T``       ``[T]``     the sequence (a prompt and its response, rendered)
``weights_T``      ``[T]``     1 on the positions to distil (the response), 0 elsewhere
``ids_T_K``        ``[T, K]``  row ``t``: the teacher's top ``K`` tokens after ``tokens_T[:t+1]``
``probs_T_K``      ``[T, K]``  their probabilities, renormalised over the ``K`` (a soft target)
=================  ==========  ==================================================================

The teacher is asked once per sequence (``topk_prompt_logprobs=K`` on a sampling call with
``max_tokens=1``: the local engine, ``tempering serve`` and the hosted service all answer it).
The datum's ``target_tokens`` is ``ids_T_K`` and its ``weights`` ``weights_T * probs_T_K``,
so ``cross_entropy`` trains the student's distribution towards the teacher's top-K.

The teacher must share the student's tokenizer (its ids are the student's targets):
:func:`check_same_tokenizer` refuses a mismatch by name, before any sampling.

Example::

    check_same_tokenizer(student_tokenizer, teacher_tokenizer, teacher="Qwen/Qwen3-8B")
    ids_T_K, logprobs_T_K = await teacher_topk(teacher_sampler, tokens_T, k=8)
    datum = topk_datum(tokens_T, weights_T, ids_T_K, logprobs_T_K)
    training_client.forward_backward([datum], "cross_entropy")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt
import tinker
from tinker import types as ttypes

from tempering.backends import require
from tempering_protocols import Future, SamplingClient, Tokenizer

__all__ = [
    "TeacherTokenizerMismatchError",
    "check_same_tokenizer",
    "teacher_topk",
    "topk_datum",
]

_MASK = -99999.0  # the SDK's empty-slot logprob (tinker.types.topk_logprobs.MASK_LOGPROB)


class TeacherTokenizerMismatchError(ValueError):
    """The teacher's tokenizer differs from the student's: its top-K ids would not be the
    student's tokens. The message names the teacher and the first difference."""


class _TopkSampler(Protocol):
    """What top-K scoring asks of a teacher: the SDK's (and the local engine's) ``sample`` with
    ``topk_prompt_logprobs``, which :class:`~tempering_protocols.SamplingClient` does not name."""

    def sample(
        self,
        prompt: tinker.ModelInput,
        num_samples: int,
        sampling_params: tinker.SamplingParams,
        include_prompt_logprobs: bool,
        /,
        *,
        topk_prompt_logprobs: int,
    ) -> Future[ttypes.SampleResponse]: ...


def _vocab(tokenizer: Tokenizer) -> dict[str, int] | None:
    get = getattr(tokenizer, "get_vocab", None)
    return cast("dict[str, int]", get()) if callable(get) else None


def check_same_tokenizer(student: Tokenizer, teacher: Tokenizer, *, teacher_name: str) -> None:
    """Raise :class:`TeacherTokenizerMismatchError` unless both tokenizers map every token to
    the same id (compared on their vocabularies; tokenizers without ``get_vocab`` are compared
    on a probe text).

    Example::

        check_same_tokenizer(load_tokenizer(student), load_tokenizer(teacher), teacher_name=teacher)
    """
    sv, tv = _vocab(student), _vocab(teacher)
    if sv is not None and tv is not None:
        if sv == tv:
            return
        only = sorted(set(sv) ^ set(tv))
        moved = sorted(t for t in set(sv) & set(tv) if sv[t] != tv[t])
        what = (
            f"{len(only)} tokens are in one vocabulary only (e.g. {only[0]!r})"
            if only
            else f"{len(moved)} tokens have other ids (e.g. {moved[0]!r}: {sv[moved[0]]} vs {tv[moved[0]]})"
        )
        raise TeacherTokenizerMismatchError(
            f"teacher {teacher_name!r} has another tokenizer than the student ({len(sv)} vs {len(tv)} "
            f"tokens; {what}): top-K distillation needs the same token ids; use a teacher of the "
            "student's family, or on-policy distillation on text"
        )
    probe = "Tempering probe: 2+2=4, ∑ é 東"
    a = list(student.encode(probe, add_special_tokens=False))
    b = list(teacher.encode(probe, add_special_tokens=False))
    if a != b:
        raise TeacherTokenizerMismatchError(
            f"teacher {teacher_name!r} tokenizes a probe text differently from the student ({a[:8]} vs "
            f"{b[:8]}): top-K distillation needs the same token ids"
        )


async def teacher_topk(
    teacher: SamplingClient, tokens_T: Sequence[int], k: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The teacher's top ``k`` next tokens and their logprobs after every prefix of ``tokens_T``:
    ``[T, k]`` arrays, row ``t`` predicting ``tokens_T[t + 1]`` (the last row, past the end, is
    empty: id 0, logprob ``-99999``).

    Example::

        ids_T_K, logprobs_T_K = await teacher_topk(sampler, [1, 2, 3], k=4)
    """
    if k < 1:
        raise ValueError(f"k (teacher tokens per position) must be >= 1, got {k}")
    if len(tokens_T) < 2:
        raise ValueError(f"a sequence to distil needs at least 2 tokens, got {len(tokens_T)}")
    require(teacher, "topk_logprobs", "top-K distillation (the teacher's sampler)")
    sampler = cast("_TopkSampler", teacher)
    params = tinker.SamplingParams(max_tokens=1, temperature=1.0)
    response = await sampler.sample(
        tinker.ModelInput.from_ints(list(tokens_T)), 1, params, False, topk_prompt_logprobs=k
    )
    topk = response.topk_prompt_logprobs_np
    if topk is None:
        raise RuntimeError("the teacher's sampler returned no topk_prompt_logprobs (does it support them?)")
    n = len(tokens_T)
    ids_T_K = np.zeros((n, k), dtype=np.int64)
    logprobs_T_K = np.full((n, k), _MASK, dtype=np.float32)
    # The SDK's row i (i >= 1) is the distribution given tokens[:i]: it predicts tokens[i], which
    # is our row i - 1; row 0 has no context.
    got = min(k, topk.token_ids.shape[1])
    ids_T_K[: n - 1, :got] = topk.token_ids[1:n, :got]
    logprobs_T_K[: n - 1, :got] = topk.logprobs[1:n, :got]
    return ids_T_K, logprobs_T_K


def topk_datum(
    tokens_T: Sequence[int],
    weights_T: Sequence[float],
    ids_T_K: npt.NDArray[np.int64],
    logprobs_T_K: npt.NDArray[np.float32],
) -> tinker.Datum:
    """A ``cross_entropy`` datum whose targets are the teacher's top-K (input: ``tokens_T[:-1]``;
    row ``t`` targets the teacher's distribution after ``tokens_T[:t+1]``, weighted by
    ``weights_T[t + 1]``, the weight of the token it predicts).

    Example::

        datum = topk_datum([1, 2, 3], [0, 1, 1], ids_T_K, logprobs_T_K)
    """
    n = len(tokens_T)
    if len(weights_T) != n or ids_T_K.shape[0] != n or logprobs_T_K.shape != ids_T_K.shape:
        raise ValueError(
            f"tokens ({n}), weights ({len(weights_T)}), ids {ids_T_K.shape} and logprobs "
            f"{logprobs_T_K.shape} must agree: one weight per token, one [T, K] row per token"
        )
    valid_T_K = logprobs_T_K > _MASK / 2
    probs_T_K = np.where(valid_T_K, np.exp(logprobs_T_K.astype(np.float64)), 0.0)
    total_T_1 = probs_T_K.sum(axis=1, keepdims=True)
    probs_T_K = np.divide(probs_T_K, total_T_1, out=np.zeros_like(probs_T_K), where=total_T_1 > 0)
    w_T_1 = np.asarray(weights_T, dtype=np.float64)[1:, None]
    weights_T_K = (w_T_1 * probs_T_K[:-1]).astype(np.float32)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(list(tokens_T[:-1])),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_numpy(ids_T_K[:-1].astype(np.int64)),
            "weights": tinker.TensorData.from_numpy(weights_T_K),
        },
    )
