"""Off-policy top-K distillation as a trainer: the student's held-out cross-entropy against the
teacher's top-K falls; a teacher with another tokenizer is refused before the service is touched;
a teacher that reads another prompt has its rows moved onto the student's trained suffix."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import tempering.sft.offpolicy as offpolicy
from tempering.assets import path as asset_path
from tempering.backend import ModelConfig, load_tokenizer
from tempering.local import ServiceClient
from tempering.sft.offpolicy import DatumDataset, TopKDistillConfig, collect_topk_datums, topk_targets
from tempering.sft.topk_distill import TeacherTokenizerMismatchError, teacher_topk, topk_datum
from tempering.training import AdamConfig, LRSchedule, RunConfig


def _chats(tmp_path: Path, name: str, n: int, skip: int = 0) -> str:
    lines = asset_path("arithmetic_chat.jsonl").read_text().splitlines()[skip : skip + n]
    out = tmp_path / name
    out.write_text("\n".join(lines) + "\n")
    return str(out)


@pytest.mark.timeout(300)
def test_topk_distillation_brings_the_student_towards_the_teacher(
    service: ServiceClient, tmp_path: Path
) -> None:
    config = TopKDistillConfig(
        run=RunConfig(log_dir=str(tmp_path / "run"), save_every=0, eval_every=0, progress=False),
        model=ModelConfig(base_model="tempering/tiny", lora_rank=0, seed=1),
        teacher_model="tempering/tiny",  # its own initialisation (seed 0): another network
        train_path=_chats(tmp_path, "train.jsonl", 32),
        test_path=_chats(tmp_path, "test.jsonl", 16, skip=200),
        k=4,
        batch_size=8,
        adam=AdamConfig(learning_rate=3e-3, schedule=LRSchedule("constant")),
        num_epochs=4,
    )
    result = asyncio.run(config(service))
    first, last = result.metrics[0], result.metrics[-1]
    assert len(result.metrics) == 16
    assert last["test_topk/nll"] < 0.8 * first["initial/test_topk/nll"]
    assert "test/nll" in last
    assert "initial/test/nll" in first


def test_a_teacher_with_another_tokenizer_is_refused_before_the_service_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    other = PreTrainedTokenizerFast(tokenizer_object=backend)

    def tokenizer_of(name: str) -> object:
        return other if name == "big/teacher" else load_tokenizer(name)

    monkeypatch.setattr(offpolicy, "load_tokenizer", tokenizer_of)

    class Untouchable:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the service was used ({name}) before the tokenizer check")

    config = TopKDistillConfig(run=RunConfig(log_dir=str(tmp_path / "run")), teacher_model="big/teacher")
    with pytest.raises(TeacherTokenizerMismatchError, match="teacher 'big/teacher'"):
        asyncio.run(config(Untouchable()))  # pyright: ignore[reportArgumentType]


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"TopKDistillConfig.k must be >= 1"):
        TopKDistillConfig(run=RunConfig(log_dir=str(tmp_path)), k=0)


@pytest.mark.timeout(120)
def test_a_teacher_reading_another_prompt_is_aligned_on_the_shared_suffix(service: ServiceClient) -> None:
    client = service.create_lora_training_client("tempering/tiny", rank=4, seed=0).result()
    teacher = client.save_weights_and_get_sampling_client("aligned-teacher")
    student_T = [3, 17, 42, 9, 8, 31]
    weights_T = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    teacher_T = [5, 6, 7, 11, 13, 17, 42, 9, 8, 31]  # another prompt, the same [17, 42] + trained part
    ids, lps = asyncio.run(topk_targets(teacher, student_T, weights_T, 3, teacher_tokens=teacher_T))
    full_ids, full_lps = asyncio.run(teacher_topk(teacher, teacher_T, 3))
    # student row 2 predicts student_T[3] = 9, the teacher's row 6 predicts teacher_T[7] = 9
    np.testing.assert_array_equal(ids[2:5], full_ids[6:9])
    np.testing.assert_allclose(lps[2:5], full_lps[6:9])
    assert (lps[:2] == -99999.0).all()
    assert (lps[5] == -99999.0).all()
    # with the same tokens it is the plain top-K
    same_ids, _ = asyncio.run(topk_targets(teacher, teacher_T, [0.0] * 7 + [1.0] * 3, 3))
    np.testing.assert_array_equal(same_ids, full_ids)
    with pytest.raises(ValueError, match="must end with the student's 3 tokens"):
        asyncio.run(topk_targets(teacher, student_T, weights_T, 3, teacher_tokens=[5, 6, 7, 8]))
    datums = asyncio.run(
        collect_topk_datums(teacher, [(student_T, weights_T)], 3, teacher_tokens=[teacher_T])
    )
    expected = topk_datum(student_T, weights_T, ids, lps)
    np.testing.assert_allclose(
        datums[0].loss_fn_inputs["weights"].to_numpy(), expected.loss_fn_inputs["weights"].to_numpy()
    )


def test_datum_dataset_batches() -> None:
    items = [json.dumps(i) for i in range(10)]  # any objects stand for datums here
    ds = DatumDataset(items, batch_size=4, seed=1)  # pyright: ignore[reportArgumentType]
    assert len(ds) == 2
    ds.set_epoch(3)
    a = ds.get_batch(0)
    ds.set_epoch(3)
    assert ds.get_batch(0) == a
    held_out = DatumDataset(items, batch_size=4, keep_last=True)  # pyright: ignore[reportArgumentType]
    assert len(held_out) == 3
    assert sorted(x for i in range(3) for x in held_out.get_batch(i)) == sorted(items)
    with pytest.raises(IndexError):
        ds.get_batch(2)
