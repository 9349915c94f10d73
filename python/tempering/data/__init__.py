"""Data: files → conversations and preference pairs → batches → datums.

Everything the trainers read before a request is built lives here (the supervised trainer
itself is ``tempering.sft``):

- :func:`load_chat` / :func:`stream_chat`: ``{"messages": [...]}`` rows from JSONL (read here,
  line by line) or JSON, Parquet and Arrow files (through Hugging Face ``datasets``, the
  ``data`` extra), in memory or one at a time.
- :func:`load_comparisons`: preference rows as ``LabeledComparison``.
- :class:`BatchedDataset`, :class:`MixtureDataset`: batches that depend only on
  (seed, epoch, index); :class:`ChatStream` for streaming.
- :class:`ChatDatasetBuilder`, :class:`ComparisonDatasetBuilder`: picklable configs whose call
  builds (train, held-out) datasets.
- :mod:`tempering.data.datums`: rendered conversations → ``tinker.Datum`` (the Rust core's
  typed front), shared with the RL path.

A malformed row raises :class:`DataError` naming the file and line; ``skip_bad_rows=True``
counts (:class:`BadRows`), logs and skips it instead.

Example::

    from tempering import assets
    from tempering.data import BatchedDataset, load_chat
    data = load_chat(assets.path("arithmetic_chat.jsonl"))
    batches = BatchedDataset(data.items, batch_size=16, seed=0)
    batches.set_epoch(1)
    batches.get_batch(0)
"""

from __future__ import annotations

from tempering.data._parse import (
    ROLES,
    Conversation,
    parse_chat_row,
    parse_comparison_row,
    parse_messages,
)
from tempering.data._rows import (
    MAX_LINE_BYTES,
    BadRows,
    DataError,
    Format,
    RowError,
    check_max_length,
    infer_format,
    parse_rows,
)
from tempering.data.batches import (
    BatchedDataset,
    MixtureDataset,
    batched,
    interleave,
    mixture_counts,
    shuffle_buffer,
)
from tempering.data.chat import (
    ChatDatasetBuilder,
    ChatSource,
    ChatStream,
    Loaded,
    SupervisedChatDataset,
    ToDatums,
    load_chat,
    stream_chat,
)
from tempering.data.preference import ComparisonDatasetBuilder, load_comparisons

__all__ = [
    "MAX_LINE_BYTES",
    "ROLES",
    "BadRows",
    "BatchedDataset",
    "ChatDatasetBuilder",
    "ChatSource",
    "ChatStream",
    "ComparisonDatasetBuilder",
    "Conversation",
    "DataError",
    "Format",
    "Loaded",
    "MixtureDataset",
    "RowError",
    "SupervisedChatDataset",
    "ToDatums",
    "batched",
    "check_max_length",
    "infer_format",
    "interleave",
    "load_chat",
    "load_comparisons",
    "mixture_counts",
    "parse_chat_row",
    "parse_comparison_row",
    "parse_messages",
    "parse_rows",
    "shuffle_buffer",
    "stream_chat",
]
