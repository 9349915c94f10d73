"""Chat data: conversations from local files, batched, mixed, rendered for supervised learning.

Files hold one ``{"messages": [...]}`` row per conversation (see docs/datasets.md). A row
that is not one raises :class:`~tempering.data.DataError` naming the file and line,
unless ``skip_bad_rows`` (then it is counted and logged).

The conversion of rendered examples to ``tinker.Datum`` is not done here: a
:class:`SupervisedChatDataset` takes a ``to_datums`` callable for it (by default in
:class:`ChatDatasetBuilder`, ``tempering.data.datums.examples_to_datums``, the Rust path).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeAlias, TypeVar

import attrs
import numpy as np
import tinker

from tempering.data._parse import Conversation, parse_chat_row
from tempering.data._rows import BadRows, Format, infer_format, parse_rows
from tempering.data.batches import BatchedDataset, MixtureDataset, batched, interleave, shuffle_buffer
from tempering.data.datums import examples_to_datums
from tempering.data.hf_source import Columns, is_hf, parse_hf_rows, parse_mapped_chat_row
from tempering.renderers import get_renderer, render_supervised_batch_sync
from tempering_protocols import Renderer, SupervisedExample, Tokenizer, TrainOnWhat

__all__ = [
    "ChatDatasetBuilder",
    "ChatSource",
    "ChatStream",
    "Loaded",
    "SupervisedChatDataset",
    "ToDatums",
    "held_out_batches",
    "load_chat",
    "load_rows",
    "stream_chat",
]

_T = TypeVar("_T")

ToDatums: TypeAlias = Callable[[Sequence[SupervisedExample]], Sequence[tinker.Datum]]
"""Turns rendered examples into training datums (``tempering.data.datums`` provides one)."""


@attrs.frozen
class Loaded(Generic[_T]):
    """Rows read from one file: the items, where each came from, and the rows skipped.

    Example::

        data = load_chat("chat.jsonl", skip_bad_rows=True)
        data.items[0]          # [{"role": "user", ...}, ...]
        data.origins[0]        # "chat.jsonl:1"
        data.bad_rows.count    # 0
    """

    path: str
    items: tuple[_T, ...]
    origins: tuple[str, ...]
    bad_rows: BadRows

    def __len__(self) -> int:
        return len(self.items)


def load_rows(
    path: str | os.PathLike[str],
    parse: Callable[[object], _T],
    *,
    format: Format | None = None,
    skip_bad_rows: bool = False,
    columns: Columns = None,
    hf_parse: Callable[[object], _T] | None = None,
) -> Loaded[_T]:
    """Every row of a file parsed by ``parse``, in memory (bad rows as in ``parse_rows``, then
    logged once); of an ``hf:`` dataset (:mod:`tempering.data.hf_source`), its rows mapped by
    ``columns`` and parsed by ``hf_parse`` (default ``parse``)."""
    bad = BadRows()
    rows = list(
        parse_hf_rows(path, hf_parse or parse, columns=columns, skip_bad_rows=skip_bad_rows, bad_rows=bad)
        if is_hf(path)
        else parse_rows(path, parse, format=format, skip_bad_rows=skip_bad_rows, bad_rows=bad)
    )
    bad.report(os.fspath(path))
    return Loaded(
        path=os.fspath(path),
        items=tuple(c for _, c in rows),
        origins=tuple(o for o, _ in rows),
        bad_rows=bad,
    )


def _chat_rows(
    path: str | os.PathLike[str], format: Format | None, skip: bool, bad: BadRows | None, columns: Columns
) -> Iterator[tuple[str, Conversation]]:
    """A local file's rows (:func:`parse_rows`), or an ``hf:`` dataset's (column-mapped)."""
    if is_hf(path):
        return parse_hf_rows(path, parse_mapped_chat_row, columns=columns, skip_bad_rows=skip, bad_rows=bad)
    return parse_rows(path, parse_chat_row, format=format, skip_bad_rows=skip, bad_rows=bad)


def load_chat(
    path: str | os.PathLike[str],
    *,
    format: Format | None = None,
    skip_bad_rows: bool = False,
    columns: Columns = None,
) -> Loaded[Conversation]:
    """Every conversation of a file, or of an ``hf:NAME[:split]`` dataset with its column
    mapping ``columns`` (:mod:`tempering.data.hf_source`), in memory.

    ``format`` defaults to the suffix: ``.jsonl`` is read by tempering, ``.json``,
    ``.parquet`` and ``.arrow`` through Hugging Face ``datasets`` (the ``data`` extra).

    Example::

        data = load_chat(tempering.assets.path("arithmetic_chat.jsonl"))
        len(data)  # 400
    """
    return load_rows(
        path,
        parse_chat_row,
        format=format,
        skip_bad_rows=skip_bad_rows,
        columns=columns,
        hf_parse=parse_mapped_chat_row,
    )


def stream_chat(
    path: str | os.PathLike[str],
    *,
    format: Format | None = None,
    skip_bad_rows: bool = False,
    bad_rows: BadRows | None = None,
    columns: Columns = None,
) -> Iterator[Conversation]:
    """The conversations of a file or an ``hf:`` dataset (streamed), one at a time (nothing
    is held in memory).

    Skipped rows are counted in ``bad_rows`` when given.

    Example::

        for convo in stream_chat("big.parquet"):
            ...
    """
    for _, convo in _chat_rows(path, format, skip_bad_rows, bad_rows, columns):
        yield convo


def _to_source(value: object) -> ChatSource:
    if isinstance(value, ChatSource):
        return value
    if isinstance(value, (str, os.PathLike)):
        return ChatSource(os.fspath(value))
    raise TypeError(f"a chat source is a path or a ChatSource, not a {type(value).__name__}")


def _to_sources(value: object) -> tuple[ChatSource, ...]:
    if isinstance(value, (str, os.PathLike, ChatSource)):
        return (_to_source(value),)
    if isinstance(value, Sequence):
        return tuple(_to_source(v) for v in value)
    raise TypeError(f"sources are a path, a ChatSource or a sequence of them, not a {type(value).__name__}")


@attrs.frozen
class ChatSource:
    """A local file of chat rows and its weight in a mixture.

    Example::

        ChatSource("math.jsonl", weight=0.3)
        ChatSource("shard.arrow", format="arrow")
    """

    path: str = attrs.field(converter=os.fspath)
    weight: float = 1.0
    format: Format | None = None
    columns: str | None = None
    """An ``hf:`` path's column mapping (``"prompt=question,completion=answer"``)."""

    def __attrs_post_init__(self) -> None:
        if not is_hf(self.path):
            infer_format(self.path, self.format)  # fail early on an unknown suffix


def _split(data: Loaded[Conversation], test_size: int, seed: int) -> tuple[list[int], list[int]]:
    """Indices of the train and held-out rows: ``test_size`` rows drawn from (seed)."""
    if not data.items:
        raise ValueError(f"{data.path}: no conversations")
    if not 0 <= test_size < len(data):
        raise ValueError(f"{data.path}: test_size={test_size} but the file has {len(data)} conversations")
    order = np.random.default_rng([seed, 1 << 20]).permutation(len(data))
    held = sorted(int(i) for i in order[:test_size])
    keep = sorted(int(i) for i in order[test_size:])
    return keep, held


class SupervisedChatDataset:
    """Batches of conversations, rendered and turned into datums: a ``SupervisedDataset``.

    ``batches`` (a :class:`BatchedDataset` or :class:`MixtureDataset` of conversations)
    decides the order; ``origins[c][i]`` labels conversation ``i`` of component ``c`` in
    errors (``"chat.jsonl:17"``). Rendering goes through the renderer's batch path.

    Example::

        ds = SupervisedChatDataset(BatchedDataset(convos, 8), renderer, to_datums)
        ds.set_epoch(0)
        datums = ds.get_batch(0)          # to_datums(ds.get_examples(0))
        convos = ds.get_conversations(0)  # the same batch, as messages
    """

    def __init__(
        self,
        batches: BatchedDataset[Conversation] | MixtureDataset[Conversation],
        renderer: Renderer,
        to_datums: ToDatums,
        *,
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
        origins: Sequence[Sequence[str]] | None = None,
    ) -> None:
        self.batches = batches
        self.renderer = renderer
        self.to_datums = to_datums
        self.train_on_what = TrainOnWhat(train_on_what)
        self.origins = origins

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int, /) -> None:
        self.batches.set_epoch(epoch)

    def get_conversations(self, index: int, /) -> list[Conversation]:
        return self.batches.get_batch(index)

    def get_examples(self, index: int, /) -> list[SupervisedExample]:
        """Batch ``index`` rendered: tokens and per-token weights."""
        names = None
        if self.origins is not None:
            names = [self.origins[c][i] for c, i in self.batches.batch_keys(index)]
        return render_supervised_batch_sync(
            self.renderer, self.get_conversations(index), self.train_on_what, names=names
        )

    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]:
        return self.to_datums(self.get_examples(index))


def _load_source(source: ChatSource, skip_bad_rows: bool) -> Loaded[Conversation]:
    return load_chat(source.path, format=source.format, skip_bad_rows=skip_bad_rows, columns=source.columns)


def held_out_batches(
    sources: Sequence[ChatSource],
    batch_size: int,
    *,
    skip_bad_rows: bool = False,
    drawn: Sequence[tuple[Conversation, str]] = (),
) -> tuple[BatchedDataset[Conversation], list[str]] | None:
    """A held-out set in batches of ``batch_size``, in order (the last batch may be short), with
    each conversation's origin: ``drawn`` (``(conversation, origin)`` held out of the training
    sources), then every conversation of ``sources``, each read once; None when there is none.

    Example::

        batches, origins = held_out_batches([ChatSource("test.jsonl")], 32)
    """
    items = [c for c, _ in drawn]
    origins = [o for _, o in drawn]
    for source in sources:
        data = _load_source(source, skip_bad_rows)
        items += data.items
        origins += data.origins
    if not items:
        return None
    return BatchedDataset(items, batch_size, shuffle=False, drop_last=False), origins


@attrs.frozen
class ChatDatasetBuilder:
    """A picklable config for a chat SFT dataset; calling it builds (train, held-out).

    ``sources`` are files (paths or :class:`ChatSource` with weights); several are mixed by
    weight (:class:`MixtureDataset`, ``epoch_size`` items an epoch). ``tokenizer`` is a
    picklable factory (a module-level function or ``functools.partial``), called once per
    build. Held-out data: ``test_size`` conversations drawn from each source, plus every
    conversation of ``test_sources``. ``to_datums`` turns rendered examples into datums
    (default: ``tempering.data.datums.examples_to_datums``; a ``functools.partial`` of it
    sets ``max_length``); :meth:`build_conversations` works without it.

    Example::

        builder = ChatDatasetBuilder(
            sources=[tempering.assets.path("arithmetic_chat.jsonl")],
            tokenizer=functools.partial(AutoTokenizer.from_pretrained, "Qwen/Qwen3-0.6B"),
            renderer_name="qwen3_disable_thinking",
            batch_size=32,
            test_size=50,
        )
        train, test = builder()
    """

    sources: tuple[ChatSource, ...] = attrs.field(converter=_to_sources)
    tokenizer: Callable[[], Tokenizer]
    renderer_name: str
    batch_size: int
    to_datums: ToDatums | None = examples_to_datums
    train_on_what: TrainOnWhat = attrs.field(
        default=TrainOnWhat.LAST_ASSISTANT_MESSAGE, converter=TrainOnWhat
    )
    test_sources: tuple[ChatSource, ...] = attrs.field(default=(), converter=_to_sources)
    test_size: int = 0
    seed: int = 0
    epoch_size: int | None = None
    skip_bad_rows: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.sources:
            raise ValueError("ChatDatasetBuilder needs at least one source")

    def build_conversations(
        self,
    ) -> tuple[
        tuple[BatchedDataset[Conversation] | MixtureDataset[Conversation], list[list[str]]],
        tuple[BatchedDataset[Conversation], list[str]] | None,
    ]:
        """The batched conversations (train, held-out), each with the origin of every row.

        Example::

            (train, train_origins), test = builder.build_conversations()
            train.get_batch(0)   # batch_size conversations
        """
        train_items: list[list[Conversation]] = []
        train_origins: list[list[str]] = []
        drawn: list[tuple[Conversation, str]] = []
        for source in self.sources:
            data = _load_source(source, self.skip_bad_rows)
            keep, held = _split(data, self.test_size, self.seed)
            train_items.append([data.items[i] for i in keep])
            train_origins.append([data.origins[i] for i in keep])
            drawn += [(data.items[i], data.origins[i]) for i in held]
        train: BatchedDataset[Conversation] | MixtureDataset[Conversation]
        if len(self.sources) == 1 and self.epoch_size is None:
            train = BatchedDataset(train_items[0], self.batch_size, seed=self.seed)
        else:
            weights = [s.weight for s in self.sources]
            train = MixtureDataset(
                train_items, weights, self.batch_size, seed=self.seed, epoch_size=self.epoch_size
            )
        if len(train) == 0:
            n = sum(len(items) for items in train_items) if self.epoch_size is None else self.epoch_size
            raise ValueError(f"{n} training conversations make no batch of {self.batch_size}")
        test = held_out_batches(
            self.test_sources, self.batch_size, skip_bad_rows=self.skip_bad_rows, drawn=drawn
        )
        return (train, train_origins), test

    def __call__(self) -> tuple[SupervisedChatDataset, SupervisedChatDataset | None]:
        """Load, split, and wrap with the renderer and ``to_datums``."""
        if self.to_datums is None:
            raise ValueError(
                "ChatDatasetBuilder.to_datums is not set: pass the function that turns "
                "SupervisedExamples into tinker.Datum (build_conversations() works without it)"
            )
        renderer = get_renderer(self.renderer_name, self.tokenizer())
        (train, train_origins), test = self.build_conversations()
        train_ds = SupervisedChatDataset(
            train, renderer, self.to_datums, train_on_what=self.train_on_what, origins=train_origins
        )
        test_ds = None
        if test is not None:
            test_ds = SupervisedChatDataset(
                test[0], renderer, self.to_datums, train_on_what=self.train_on_what, origins=[test[1]]
            )
        return train_ds, test_ds


@attrs.frozen
class ChatStream:
    """Streaming chat batches from files too big for memory; picklable.

    Each epoch reads the sources again: several are interleaved by weight (until the first
    runs out), shuffled through a buffer of ``buffer_size`` conversations, and batched. The
    batches depend only on (seed, epoch) and the files; ``start`` skips to a batch index.

    Example::

        stream = ChatStream(["a.parquet", ChatSource("b.jsonl", weight=0.5)], batch_size=16)
        for batch in stream.batches(epoch=0):
            ...  # 16 conversations
    """

    sources: tuple[ChatSource, ...] = attrs.field(converter=_to_sources)
    batch_size: int
    buffer_size: int = 1024
    seed: int = 0
    skip_bad_rows: bool = False

    def batches(
        self, epoch: int = 0, *, start: int = 0, bad_rows: BadRows | None = None
    ) -> Iterator[list[Conversation]]:
        """The batches of ``epoch``, from batch ``start`` on; skipped rows go to ``bad_rows``."""
        streams = [
            stream_chat(
                s.path,
                format=s.format,
                skip_bad_rows=self.skip_bad_rows,
                bad_rows=bad_rows,
                columns=s.columns,
            )
            for s in self.sources
        ]
        mixed = (
            streams[0]
            if len(streams) == 1
            else interleave(streams, [s.weight for s in self.sources], seed=self.seed, epoch=epoch)
        )
        shuffled = shuffle_buffer(mixed, self.buffer_size, seed=self.seed, epoch=epoch)
        for index, batch in enumerate(batched(shuffled, self.batch_size)):
            if index >= start:
                yield batch
