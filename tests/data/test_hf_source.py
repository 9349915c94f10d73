"""``hf:`` data paths for SFT and DPO: the same ``datasets.load_dataset`` path on local copies
(a dataset directory, or the ``json`` builder with ``data_files``), column mappings, errors
naming the row and field, and a streamed dataset consumed by the SFT trainer batch by batch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from dataset_helpers import WriteRows

from tempering.data import ChatStream, DataError, load_chat, load_comparisons
from tempering.data.datums import examples_to_datums
from tempering.data.hf_source import HFSource, parse_columns
from tempering.data.streaming import StreamingChatDataset
from tempering.local.tiny import build_tiny_tokenizer
from tempering.renderers import get_renderer

GSM8K = Path(__file__).resolve().parent / "hub_fixtures" / "gsm8k"


def _chat_rows(n: int) -> list[dict[str, object]]:
    return [
        {"messages": [{"role": "user", "content": f"{i} + 1?"}, {"role": "assistant", "content": str(i + 1)}]}
        for i in range(n)
    ]


def test_paths_and_column_mappings_parse() -> None:
    assert HFSource.parse("hf:openai/gsm8k:test") == HFSource("openai/gsm8k", "test")
    assert HFSource.parse("hf:HuggingFaceH4/no_robots").split == "train"
    source = HFSource.parse("hf:json", "data_files=a.jsonl, prompt=q ,config=main")
    assert (source.name, source.data_files, source.config, dict(source.columns)) == (
        "json",
        "a.jsonl",
        "main",
        {"prompt": "q"},
    )
    assert parse_columns({"messages": "conversations"}) == {"messages": "conversations"}
    with pytest.raises(ValueError, match="'prompt' is not field=column"):
        parse_columns("prompt")
    with pytest.raises(ValueError, match="not an hf: path"):
        HFSource.parse("data.jsonl")


def test_chat_from_a_dataset_directory_with_a_column_mapping() -> None:
    data = load_chat(f"hf:{GSM8K}:test", columns="prompt=question,completion=answer")
    assert len(data) == 2
    first = data.items[0]
    assert [m["role"] for m in first] == ["user", "assistant"]
    assert first[1]["content"].endswith("#### 26")
    assert data.origins[1] == f"hf:{GSM8K} [test]: row 2"


def test_chat_messages_through_the_json_builder(write_jsonl: WriteRows) -> None:
    path = write_jsonl("chat.jsonl", _chat_rows(5))
    data = load_chat("hf:json", columns=f"data_files={path}")
    assert [c[-1]["content"] for c in data.items] == ["1", "2", "3", "4", "5"]


def test_a_bad_row_names_the_dataset_row_and_field(write_jsonl: WriteRows) -> None:
    path = write_jsonl("bad.jsonl", [{"q": "1?", "a": "1"}, {"q": "2?", "a": None}])
    with pytest.raises(DataError, match=r"hf:json \[train\]: row 2: field 'completion' is None"):
        load_chat("hf:json", columns=f"data_files={path},prompt=q,completion=a")
    skipped = load_chat("hf:json", columns=f"data_files={path},prompt=q,completion=a", skip_bad_rows=True)
    assert (len(skipped), skipped.bad_rows.count) == (1, 1)


def test_preference_pairs_with_a_column_mapping(write_jsonl: WriteRows) -> None:
    path = write_jsonl("pairs.jsonl", [{"question": "2+2?", "good": "4", "bad": "5"}] * 3)
    data = load_comparisons("hf:json", columns=f"data_files={path},prompt=question,chosen=good,rejected=bad")
    assert len(data) == 3
    pair = data.items[0]
    assert pair.label == "A"
    assert pair.comparison.completion_A[0]["content"] == "4"


def test_a_stream_is_read_batch_by_batch(write_jsonl: WriteRows) -> None:
    path = write_jsonl("many.jsonl", _chat_rows(64))
    renderer = get_renderer("chatml", build_tiny_tokenizer())
    stream = ChatStream([f"hf:{path}"], batch_size=4, buffer_size=8)
    train = StreamingChatDataset(stream, renderer, examples_to_datums, batches_per_epoch=16)
    first = train.get_batch(0)
    assert len(first) == 4
    assert train.batches_read == 1
    train.get_batch(1)
    assert train.batches_read == 2
    # Another index (a resume) restarts the stream there; the same index gives the same batch.
    again = [d.model_input.to_ints() for d in train.get_batch(0)]
    assert again == [d.model_input.to_ints() for d in first]
    short = StreamingChatDataset(stream, renderer, examples_to_datums, batches_per_epoch=20)
    with pytest.raises(ValueError, match="ran out after 16 batches of 4 in epoch 0"):
        short.get_batch(16)


@pytest.mark.timeout(180)
def test_the_sft_trainer_consumes_a_streamed_hf_dataset(write_jsonl: WriteRows, tmp_path: Path) -> None:
    from tempering.backend import ModelConfig
    from tempering.local import ServiceClient
    from tempering.sft import ChatData, SFTConfig
    from tempering.training import RunConfig

    path = write_jsonl("train.jsonl", [{"q": f"{i}+1?", "a": str(i + 1)} for i in range(40)])
    data = ChatData(
        path="hf:json",
        test_path=None,
        columns=f"data_files={path},prompt=q,completion=a",
        streaming=True,
        stream_batches=3,
        batch_size=4,
    )
    builder = data(ModelConfig(lora_rank=0))
    assert builder.__class__.__name__ == "StreamingChatDatasetBuilder"
    config = SFTConfig(run=RunConfig(log_dir=str(tmp_path / "run"), progress=False), data=data, max_steps=3)
    service = ServiceClient(num_threads=1, device="cpu")
    try:
        result = asyncio.run(config(service=service))
    finally:
        service.close()
    assert [m["step"] for m in result.metrics] == [0, 1, 2]
    assert all(m["tokens/trained"] > 0 for m in result.metrics)
