"""Off-policy top-K distillation: the teacher's top-K rows line up with the tokens they predict,
the datum's loss is the cross-entropy against the teacher's renormalised top-K, and a teacher with
another tokenizer is refused by name before any sampling."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tinker
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tempering.local import ServiceClient
from tempering.local.tiny import build_tiny_tokenizer
from tempering.sft.topk_distill import (
    TeacherTokenizerMismatchError,
    check_same_tokenizer,
    teacher_topk,
    topk_datum,
)

TOKENS = [3, 17, 42, 9, 8, 31, 5, 12]
WEIGHTS = [0, 0, 0, 1, 1, 1, 1, 1]


@pytest.mark.timeout(120)
def test_teacher_topk_rows_predict_the_next_token(service: ServiceClient) -> None:
    student = service.create_lora_training_client("tempering/tiny", rank=4, seed=0).result()
    teacher = student.save_weights_and_get_sampling_client("topk-teacher")
    ids_T_K, logprobs_T_K = asyncio.run(teacher_topk(teacher, TOKENS, k=4))
    assert ids_T_K.shape == logprobs_T_K.shape == (len(TOKENS), 4)
    assert (logprobs_T_K[-1] == -99999.0).all()  # past the end: empty
    # Row t is the distribution after TOKENS[:t+1]: where it holds TOKENS[t+1], its logprob is the
    # sampler's prompt logprob of that token.
    exact = teacher.compute_logprobs(tinker.ModelInput.from_ints(TOKENS)).result()
    best_T = logprobs_T_K[:-1].max(axis=1)
    for t in range(len(TOKENS) - 1):
        lp = exact[t + 1]
        assert lp is not None
        assert lp <= best_T[t] + 1e-4
        hit = np.flatnonzero(ids_T_K[t] == TOKENS[t + 1])
        if hit.size:
            assert abs(float(logprobs_T_K[t, hit[0]]) - lp) < 1e-3

    # The student is the teacher: the loss is the teacher's own top-K cross-entropy.
    datum = topk_datum(TOKENS, WEIGHTS, ids_T_K, logprobs_T_K)
    out = student.forward_backward([datum], "cross_entropy").result()
    valid = logprobs_T_K[:-1] > -1e4
    p_T_K = np.where(valid, np.exp(logprobs_T_K[:-1].astype(np.float64)), 0.0)
    p_T_K /= p_T_K.sum(axis=1, keepdims=True)
    w_T_1 = np.asarray(WEIGHTS[1:], dtype=np.float64)[:, None]
    expected = float(-(w_T_1 * p_T_K * np.where(valid, logprobs_T_K[:-1], 0.0)).sum())
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-3)


def test_topk_datum_checks_shapes() -> None:
    ids = np.zeros((3, 2), dtype=np.int64)
    with pytest.raises(ValueError, match=r"one weight per token"):
        topk_datum([1, 2, 3], [1, 1], ids, np.zeros((3, 2), dtype=np.float32))


def test_a_teacher_with_another_tokenizer_is_refused_by_name() -> None:
    student = build_tiny_tokenizer()
    check_same_tokenizer(student, build_tiny_tokenizer(), teacher_name="same")  # equal: fine
    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    other = PreTrainedTokenizerFast(tokenizer_object=backend)
    with pytest.raises(TeacherTokenizerMismatchError, match="teacher 'big/teacher' has another tokenizer"):
        check_same_tokenizer(student, other, teacher_name="big/teacher")


def test_k_and_length_are_checked_before_sampling() -> None:
    class NoSampler:
        def sample(self, *args: object, **kw: object) -> object:
            raise AssertionError("sampled")

    with pytest.raises(ValueError, match=r"k .* must be >= 1"):
        asyncio.run(teacher_topk(NoSampler(), TOKENS, k=0))  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="at least 2 tokens"):
        asyncio.run(teacher_topk(NoSampler(), [1], k=2))  # pyright: ignore[reportArgumentType]
