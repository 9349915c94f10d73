"""A supervised dataset read from a stream: batches rendered as the trainer asks for them.

:class:`StreamingChatDataset` is a ``SupervisedDataset`` over a :class:`~tempering.data.ChatStream`
(local files or ``hf:`` datasets, read with ``streaming=True``): only the shuffle buffer and
the current batch are held in memory. Batches are served in order; asking for another index
(a resumed run) restarts the stream there, skipping the batches before it. ``len`` is the
number of batches an epoch is taken to have (``batches_per_epoch``), since a stream's length is
not known; an epoch whose stream runs out early raises, naming the source and what to do.

Example::

    stream = ChatStream(["hf:HuggingFaceH4/no_robots:train"], batch_size=32)
    train = StreamingChatDataset(stream, renderer, examples_to_datums, batches_per_epoch=1000)
    await train_supervised(config, ..., train=train, max_steps=1000)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import attrs
import tinker

from tempering.data._parse import Conversation
from tempering.data.chat import (
    ChatSource,
    ChatStream,
    SupervisedChatDataset,
    ToDatums,
    _to_sources,  # pyright: ignore[reportPrivateUsage]
    held_out_batches,
)
from tempering.data.datums import examples_to_datums
from tempering.renderers import get_renderer, render_supervised_batch_sync
from tempering_protocols import Renderer, Tokenizer, TrainOnWhat

__all__ = ["StreamingChatDataset", "StreamingChatDatasetBuilder"]


class StreamingChatDataset:
    """Batches of a :class:`ChatStream`, rendered and turned into datums (a ``SupervisedDataset``)."""

    def __init__(
        self,
        stream: ChatStream,
        renderer: Renderer,
        to_datums: ToDatums,
        *,
        batches_per_epoch: int,
        train_on_what: TrainOnWhat | str = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    ) -> None:
        if batches_per_epoch < 1:
            raise ValueError(f"StreamingChatDataset: batches_per_epoch must be >= 1, got {batches_per_epoch}")
        self.stream = stream
        self.renderer = renderer
        self.to_datums = to_datums
        self.batches_per_epoch = batches_per_epoch
        self.train_on_what = TrainOnWhat(train_on_what)
        self._epoch = 0
        self._batches: Iterator[list[Conversation]] | None = None
        self._next = 0
        self.batches_read = 0
        """Batches read from the stream so far (for tests and logs)."""

    def __len__(self) -> int:
        return self.batches_per_epoch

    def set_epoch(self, epoch: int, /) -> None:
        if epoch != self._epoch:
            self._epoch, self._batches = epoch, None

    def get_conversations(self, index: int, /) -> list[Conversation]:
        if self._batches is None or index != self._next:
            self._batches = self.stream.batches(self._epoch, start=index)
            self._next = index
        batch = next(self._batches, None)
        if batch is None:
            sources = ", ".join(s.path for s in self.stream.sources)
            raise ValueError(
                f"{sources}: the stream ran out after {self._next} batches of {self.stream.batch_size} in "
                f"epoch {self._epoch}, but an epoch was taken to have {self.batches_per_epoch}: "
                "set batches_per_epoch (or max_steps) to at most what the data holds"
            )
        self._next += 1
        self.batches_read += 1
        return batch

    def get_batch(self, index: int, /) -> Sequence[tinker.Datum]:
        examples = render_supervised_batch_sync(
            self.renderer, self.get_conversations(index), self.train_on_what
        )
        return self.to_datums(examples)


@attrs.frozen
class StreamingChatDatasetBuilder:
    """A picklable config for streamed chat SFT data; calling it builds (train, held-out).

    The train set is a :class:`StreamingChatDataset` over ``sources`` (nothing loaded up
    front); the held-out set, if ``test_sources`` are given, is every conversation of them, loaded
    in memory in file order (:func:`~tempering.data.chat.held_out_batches`, as
    :class:`~tempering.data.ChatDatasetBuilder`'s ``test_sources``).

    Example::

        StreamingChatDatasetBuilder(sources=["hf:HuggingFaceH4/no_robots:train"], tokenizer=tok,
                                    renderer_name="chatml", batch_size=32, batches_per_epoch=500)()
    """

    sources: tuple[ChatSource, ...] = attrs.field(converter=_to_sources)
    tokenizer: Callable[[], Tokenizer]
    renderer_name: str
    batch_size: int
    batches_per_epoch: int
    to_datums: ToDatums = examples_to_datums
    train_on_what: TrainOnWhat = attrs.field(
        default=TrainOnWhat.LAST_ASSISTANT_MESSAGE, converter=TrainOnWhat
    )
    test_sources: tuple[ChatSource, ...] = attrs.field(default=(), converter=_to_sources)
    buffer_size: int = 1024
    seed: int = 0
    skip_bad_rows: bool = False

    def __call__(self) -> tuple[StreamingChatDataset, SupervisedChatDataset | None]:
        renderer = get_renderer(self.renderer_name, self.tokenizer())
        stream = ChatStream(
            self.sources,
            self.batch_size,
            buffer_size=self.buffer_size,
            seed=self.seed,
            skip_bad_rows=self.skip_bad_rows,
        )
        train = StreamingChatDataset(
            stream,
            renderer,
            self.to_datums,
            batches_per_epoch=self.batches_per_epoch,
            train_on_what=self.train_on_what,
        )
        held = held_out_batches(self.test_sources, self.batch_size, skip_bad_rows=self.skip_bad_rows)
        test = None
        if held is not None:
            batches, origins = held
            test = SupervisedChatDataset(
                batches, renderer, self.to_datums, train_on_what=self.train_on_what, origins=[origins]
            )
        return train, test
