"""Builders: picklable configs that build (train, held-out) datasets conforming to the protocols."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import tinker
from dataset_helpers import WriteRows, chat_row
from renderer_tokenizers import make_tokenizer  # pyright: ignore[reportMissingImports]  # on sys.path via conftest
from transformers import PreTrainedTokenizerFast

from tempering import assets
from tempering.data import (
    BadRows,
    ChatDatasetBuilder,
    ChatSource,
    ChatStream,
    ComparisonDatasetBuilder,
    MixtureDataset,
    SupervisedChatDataset,
)
from tempering.data.streaming import StreamingChatDatasetBuilder
from tempering.renderers import NoTrainableTokensError
from tempering_protocols import ComparisonDataset, LabeledComparison, SupervisedDataset, SupervisedExample
from tempering_protocols.testing import check_supervised_dataset, check_supervised_dataset_builder


def tokenizer() -> PreTrainedTokenizerFast:
    """A picklable tokenizer factory (module-level function)."""
    return make_tokenizer()


def next_token_datums(examples: Sequence[SupervisedExample]) -> list[tinker.Datum]:
    """A stand-in for tempering.data.datums: shift by one, weights of the targets."""
    out: list[tinker.Datum] = []
    for ex in examples:
        tokens = ex.model_input.to_ints()
        out.append(
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tinker.TensorData.from_numpy(np.asarray(tokens[1:], dtype=np.int64)),
                    "weights": tinker.TensorData.from_numpy(ex.weights[1:]),
                },
            )
        )
    return out


def chat_builder(**overrides: object) -> ChatDatasetBuilder:
    config: dict[str, object] = {
        "sources": [assets.path("arithmetic_chat.jsonl")],
        "tokenizer": tokenizer,
        "renderer_name": "chatml",
        "batch_size": 16,
        "to_datums": next_token_datums,
        "test_size": 40,
    }
    config.update(overrides)
    return ChatDatasetBuilder(**config)  # pyright: ignore[reportArgumentType]  # test shorthand


def test_chat_builder_passes_the_conformance_kit() -> None:
    check_supervised_dataset_builder(chat_builder())


def test_chat_builder_split_and_batches() -> None:
    train, test = chat_builder()()
    assert isinstance(train, SupervisedDataset)
    assert isinstance(train, SupervisedChatDataset)
    assert len(train) == 360 // 16
    assert test is not None
    assert len(test) == 3  # 40 held out, batches of 16, the last one kept
    (train_batches, train_origins), held = chat_builder().build_conversations()
    assert held is not None
    assert len(set(held[1])) == 40
    assert not set(held[1]) & set(train_origins[0])
    examples = train.get_examples(0)
    datums = train.get_batch(0)
    assert len(examples) == len(datums) == 16
    assert [d.model_input.length for d in datums] == [e.model_input.length - 1 for e in examples]
    assert train.get_conversations(0) == train_batches.get_batch(0)
    check_supervised_dataset(train, indices=[0, len(train) - 1])


def test_chat_builder_pickles_and_rebuilds_the_same_batches() -> None:
    builder = chat_builder(seed=5)
    clone = pickle.loads(pickle.dumps(builder))
    assert clone == builder
    (a, _), (b, _) = builder(), clone()
    for ds in (a, b):
        ds.set_epoch(2)
    assert [d.model_input.to_ints() for d in a.get_batch(4)] == [
        d.model_input.to_ints() for d in b.get_batch(4)
    ]


def test_chat_builder_without_to_datums() -> None:
    builder = chat_builder(to_datums=None)
    with pytest.raises(ValueError, match="to_datums is not set"):
        builder()
    (train, _), _ = builder.build_conversations()
    assert len(train.get_batch(0)) == 16


def test_chat_builder_mixture(write_jsonl: WriteRows) -> None:
    a = write_jsonl("a.jsonl", [chat_row(f"a{i}", "x") for i in range(10)])
    b = write_jsonl("b.jsonl", [chat_row(f"b{i}", "y") for i in range(50)])
    builder = chat_builder(
        sources=[ChatSource(a, weight=1.0), ChatSource(str(b), weight=3.0)],
        test_size=0,
        epoch_size=80,
        batch_size=8,
    )
    (train, _), test = builder.build_conversations()
    assert isinstance(train, MixtureDataset)
    assert test is None
    questions = [c[0]["content"] for i in range(len(train)) for c in train.get_batch(i)]
    assert len(questions) == 80
    assert sum(q.startswith("a") for q in questions) == 20
    dataset, _ = builder()
    assert len(dataset) == 10


def test_chat_builder_test_sources(write_jsonl: WriteRows) -> None:
    extra = write_jsonl("extra.jsonl", [chat_row("held", "out")] * 3)
    _, test = chat_builder(test_size=0, test_sources=[extra]).build_conversations()
    assert test is not None
    assert test[1] == [f"{extra}:1", f"{extra}:2", f"{extra}:3"]


def test_bad_rows_and_untrainable_conversations_are_named(write_jsonl: WriteRows) -> None:
    rows: list[object] = [
        chat_row("q1", "a1"),
        {"messages": [{"role": "user", "content": "no answer"}]},
        "{oops",
    ]
    path = write_jsonl("chat.jsonl", rows)
    builder = chat_builder(sources=[path], test_size=0, batch_size=2)
    with pytest.raises(ValueError, match=r"chat.jsonl:3: invalid JSON"):
        builder()
    train, _ = chat_builder(sources=[path], test_size=0, batch_size=2, skip_bad_rows=True)()
    with pytest.raises(NoTrainableTokensError, match=r"chat.jsonl:2: train_on_what=last_assistant_message"):
        train.get_examples(0)
    train, _ = chat_builder(
        sources=[path], test_size=0, batch_size=2, skip_bad_rows=True, train_on_what="all_messages"
    )()
    assert len(train.get_batch(0)) == 2
    with pytest.raises(ValueError, match="test_size=5 but the file has 2 conversations"):
        chat_builder(sources=[path], test_size=5, skip_bad_rows=True).build_conversations()
    with pytest.raises(ValueError, match="make no batch of 16"):
        chat_builder(sources=[path], test_size=0, skip_bad_rows=True).build_conversations()


def test_chat_stream(write_jsonl: WriteRows, tmp_path: Path) -> None:
    a = write_jsonl("a.jsonl", ["{bad", *(chat_row(f"a{i}", "x") for i in range(40))])
    b = write_jsonl("b.jsonl", [chat_row(f"b{i}", "y") for i in range(40)])
    stream = ChatStream(
        [a, ChatSource(b, weight=1.0)], batch_size=4, buffer_size=8, seed=1, skip_bad_rows=True
    )
    bad = BadRows()
    epoch0 = list(stream.batches(0, bad_rows=bad))
    assert all(len(batch) == 4 for batch in epoch0)
    firsts = [c[0]["content"] for batch in epoch0 for c in batch]
    assert {q[0] for q in firsts} == {"a", "b"}
    assert len(set(firsts)) == len(firsts)
    assert bad.count == 1
    clone = pickle.loads(pickle.dumps(stream))
    assert list(clone.batches(0)) == epoch0
    assert list(stream.batches(0, start=3)) == epoch0[3:]
    assert list(stream.batches(1)) != epoch0
    single = ChatStream(str(b), batch_size=5, buffer_size=1)
    assert [c[0]["content"] for c in next(single.batches())] == [f"b{i}" for i in range(5)]


def test_comparison_builder() -> None:
    builder = ComparisonDatasetBuilder(
        assets.path("arithmetic_preferences.jsonl"), batch_size=16, test_size=60
    )
    assert pickle.loads(pickle.dumps(builder)) == builder
    train, test = builder()
    assert isinstance(train, ComparisonDataset)
    assert len(train) == 240 // 16
    assert test is not None
    assert len(test.items) == 60
    batch = train.get_batch(0)
    assert all(isinstance(c, LabeledComparison) for c in batch)
    train.set_epoch(1)
    other = train.get_batch(0)
    train.set_epoch(0)
    assert train.get_batch(0) == batch != other
    held = {id(c) for c in test.items}
    assert not held & {id(c) for c in train.items}


def test_comparison_builder_test_path(write_jsonl: WriteRows) -> None:
    rows: list[object] = [{"prompt": f"q{i}", "chosen": "a", "rejected": "b"} for i in range(4)]
    train_path, test_path = write_jsonl("train.jsonl", rows), write_jsonl("test.jsonl", rows[:2])
    train, test = ComparisonDatasetBuilder(train_path, batch_size=2, test_path=test_path)()
    assert len(train) == 2
    assert test is not None
    assert [c.comparison.prompt_conversation[0]["content"] for c in test.items] == ["q0", "q1"]


def test_streaming_builder_holds_out_a_test_file_smaller_than_a_batch(write_jsonl: WriteRows) -> None:
    """The streamed run's held-out set is every conversation of ``test_sources``, read once, in
    one short batch (a file of fewer conversations than ``batch_size`` is not an error)."""
    extra = write_jsonl("extra.jsonl", [chat_row(f"held {i}", "out") for i in range(3)])
    calls: list[int] = []

    def counting_tokenizer() -> PreTrainedTokenizerFast:
        calls.append(1)
        return make_tokenizer()

    builder = StreamingChatDatasetBuilder(
        sources=[assets.path("arithmetic_chat.jsonl")],
        tokenizer=counting_tokenizer,
        renderer_name="chatml",
        batch_size=16,
        batches_per_epoch=2,
        to_datums=next_token_datums,
        test_sources=[extra],
    )
    train, test = builder()
    assert len(calls) == 1
    assert len(train) == 2
    assert test is not None
    assert len(test) == 1
    assert [c[0]["content"] for c in test.get_conversations(0)] == ["held 0", "held 1", "held 2"]
    assert test.origins == [[f"{extra}:1", f"{extra}:2", f"{extra}:3"]]
    assert len(test.get_batch(0)) == 3
