"""Supervised datums: rendered conversations (tokens + a weight per token) → ``tinker.Datum``.

The work is done by the Rust core (``tempering._core.pack_examples``); this module is its typed
front and the one place that turns columnar buffers into ``tinker.Datum`` objects (the RL path in
``tempering.rl.data`` uses :func:`build_datums` too).

A rendered conversation of ``L`` positions becomes one datum of ``T = L - 1`` positions:

=================  ========  ==================================================================
key                shape     value at position ``t``
=================  ========  ==================================================================
``model_input``    ``[T]``   the conversation without its last position (right-shifted input)
``target_tokens``  ``[T]``   the token at ``t + 1`` (left-shifted targets; 0 inside an image)
``weights``        ``[T]``   the weight of the token at ``t + 1``
=================  ========  ==================================================================

Truncation to ``max_length`` keeps the first ``max_length`` positions; an image (or any other
non-token chunk) is never cut: when the cut falls inside one, or just after one, the cut moves
back to that chunk's start, because the model input must end on a token it can drop.

Example::

    example = renderer.build_supervised_example(messages, TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    datum = datum_from_example(example, max_length=4096)
    data_D = conversations_to_datums(renderer, conversations, max_length=4096)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

import attrs
import numpy as np
import numpy.typing as npt
import tinker
from tinker.types import EncodedTextChunk, ModelInputChunk, TensorData

from tempering import _core
from tempering.arrays import Float32Array, Int64Array
from tempering_protocols import FloatArray, Message, Renderer, SupervisedExample, TrainOnWhat

__all__ = [
    "DataError",
    "PackedDatums",
    "SupervisedBatch",
    "build_datums",
    "conversations_to_datums",
    "datum_from_example",
    "datum_from_model_input_weights",
    "datum_model_input",
    "examples_to_batch",
    "examples_to_datums",
    "from_packed",
    "model_input_from_columns",
    "packed_datums",
]

DataError = _core.DataError
"""Bad input (a ``ValueError``); the message names the example and token position."""

A = TypeVar("A", bound=attrs.AttrsInstance)


def model_input_from_columns(
    tokens_T: Int64Array,
    opaque_pos: Sequence[int] = (),
    opaque_len: Sequence[int] = (),
    opaque_chunks: Sequence[ModelInputChunk] = (),
) -> tinker.ModelInput:
    """A ``tinker.ModelInput`` from one datum's input tokens and its opaque (non-token) chunks.

    ``tokens_T`` holds a placeholder (0) at positions covered by opaque chunks; chunk ``k``
    starts at ``opaque_pos[k]`` and covers ``opaque_len[k]`` positions. The objects are put back
    unchanged, between token chunks.

    The values are built by the Rust core and already valid, so pydantic validation is skipped
    (``model_construct``): the result equals a validated ``ModelInput`` field for field.
    """
    if not opaque_chunks:
        return tinker.ModelInput.model_construct(
            chunks=[EncodedTextChunk.model_construct(tokens=tokens_T.tolist())]
        )
    chunks: list[ModelInputChunk] = []
    prev = 0
    for pos, n, chunk in zip(opaque_pos, opaque_len, opaque_chunks, strict=True):
        if pos > prev:
            chunks.append(EncodedTextChunk.model_construct(tokens=tokens_T[prev:pos].tolist()))
        chunks.append(chunk)
        prev = pos + n
    if prev < len(tokens_T):
        chunks.append(EncodedTextChunk.model_construct(tokens=tokens_T[prev:].tolist()))
    return tinker.ModelInput.model_construct(chunks=chunks)


def build_datums(
    tokens_N: Int64Array,
    offsets_D1: Int64Array,
    loss_fn_inputs_N: Mapping[str, npt.NDArray[np.int64] | npt.NDArray[np.float32]],
    opaque_offsets_D1: Int64Array | None = None,
    opaque_pos_C: Int64Array | None = None,
    opaque_len_C: Int64Array | None = None,
    opaque_chunks_C: Sequence[ModelInputChunk] = (),
    token_runs_D: Sequence[Sequence[list[int]]] | None = None,
) -> list[tinker.Datum]:
    """``tinker.Datum`` objects from columnar buffers, one per row of ``offsets_D1``.

    Each ``loss_fn_inputs`` value is a ``TensorData`` over a *view* of the flat buffer (no copy):
    the datums share memory with the buffers, which must not be modified afterwards. The model
    inputs' token lists come from ``tokens_N``, or, when given, from ``token_runs_D`` (ready
    lists: each datum's token runs between its opaque chunks).
    """
    offs: list[int] = offsets_D1.tolist()
    pairs = tuple(loss_fn_inputs_N.items())
    from_numpy = TensorData.from_numpy
    Datum = tinker.Datum
    ModelInput_construct = tinker.ModelInput.model_construct
    Chunk_construct = EncodedTextChunk.model_construct
    data_D: list[tinker.Datum] = []
    if not opaque_chunks_C:
        # The hot loop: per datum, one list of input tokens and a view per loss input.
        for d in range(len(offs) - 1):
            a, b = offs[d], offs[d + 1]
            tokens = tokens_N[a:b].tolist() if token_runs_D is None else token_runs_D[d][0]
            data_D.append(
                Datum(
                    model_input=ModelInput_construct(chunks=[Chunk_construct(tokens=tokens)]),
                    loss_fn_inputs={k: from_numpy(c[a:b]) for k, c in pairs},
                )
            )
        return data_D
    assert opaque_offsets_D1 is not None
    assert opaque_pos_C is not None
    assert opaque_len_C is not None
    ooffs: list[int] = opaque_offsets_D1.tolist()
    pos_C: list[int] = opaque_pos_C.tolist()
    len_C: list[int] = opaque_len_C.tolist()
    for d in range(len(offs) - 1):
        a, b = offs[d], offs[d + 1]
        ka, kb = ooffs[d], ooffs[d + 1]
        if token_runs_D is None:
            model_input = model_input_from_columns(
                tokens_N[a:b], pos_C[ka:kb], len_C[ka:kb], opaque_chunks_C[ka:kb]
            )
        else:
            runs = token_runs_D[d]
            chunks: list[ModelInputChunk] = []
            for k, opaque in enumerate(opaque_chunks_C[ka:kb]):
                if runs[k]:
                    chunks.append(Chunk_construct(tokens=runs[k]))
                chunks.append(opaque)
            if runs[-1]:
                chunks.append(Chunk_construct(tokens=runs[-1]))
            model_input = ModelInput_construct(chunks=chunks)
        data_D.append(
            Datum(model_input=model_input, loss_fn_inputs={k: from_numpy(c[a:b]) for k, c in pairs})
        )
    return data_D


class PackedDatums(Protocol):
    """Where the datums of a columnar batch lie in its flat buffers (:class:`SupervisedBatch`,
    ``tempering.rl.data.RaggedBatch``)."""

    @property
    def tokens_N(self) -> Int64Array: ...
    @property
    def offsets_D1(self) -> Int64Array: ...
    @property
    def opaque_offsets_D1(self) -> Int64Array: ...
    @property
    def opaque_pos_C(self) -> Int64Array: ...
    @property
    def opaque_len_C(self) -> Int64Array: ...
    @property
    def opaque_chunks_C(self) -> Sequence[ModelInputChunk]: ...


def datum_model_input(batch: PackedDatums, d: int) -> tinker.ModelInput:
    """The model input of datum ``d`` of a columnar batch (shared by the supervised and RL
    batches): its token slice with its opaque chunks put back in place."""
    a, b = int(batch.offsets_D1[d]), int(batch.offsets_D1[d + 1])
    ka, kb = int(batch.opaque_offsets_D1[d]), int(batch.opaque_offsets_D1[d + 1])
    return model_input_from_columns(
        batch.tokens_N[a:b],
        batch.opaque_pos_C[ka:kb].tolist(),
        batch.opaque_len_C[ka:kb].tolist(),
        batch.opaque_chunks_C[ka:kb],
    )


def packed_datums(
    batch: PackedDatums,
    loss_fn_inputs_N: Mapping[str, npt.NDArray[np.int64] | npt.NDArray[np.float32]],
    token_runs_D: Sequence[Sequence[list[int]]] | None = None,
) -> list[tinker.Datum]:
    """:func:`build_datums` over a columnar batch's buffers."""
    return build_datums(
        batch.tokens_N,
        batch.offsets_D1,
        loss_fn_inputs_N,
        batch.opaque_offsets_D1,
        batch.opaque_pos_C,
        batch.opaque_len_C,
        batch.opaque_chunks_C,
        token_runs_D,
    )


@attrs.frozen(eq=False)
class SupervisedBatch:
    """Supervised datums, columnar: ``D`` datums, ``N`` positions, ``C`` opaque chunks.

    ==========================  ==========  ==============================================
    field                       shape       meaning
    ==========================  ==========  ==============================================
    ``tokens_N``                ``[N]``     model-input tokens (0 inside opaque chunks)
    ``target_tokens_N``         ``[N]``     next token (0 inside opaque chunks)
    ``weights_N``               ``[N]``     weight of each target
    ``offsets_D1``              ``[D+1]``   datum ``d`` is ``[offsets_D1[d], offsets_D1[d+1])``
    ``opaque_offsets_D1``       ``[D+1]``   opaque chunks of datum ``d``, over ``C``
    ``opaque_pos_C``            ``[C]``     position of each opaque chunk in its datum
    ``opaque_len_C``            ``[C]``     length of each opaque chunk
    ``opaque_chunks_C``         ``C``       the chunk objects (images, ...)
    ==========================  ==========  ==============================================

    Example::

        batch = examples_to_batch(examples, max_length=2048)
        weights_T = batch.weights_N[batch.offsets_D1[0] : batch.offsets_D1[1]]
    """

    tokens_N: Int64Array
    target_tokens_N: Int64Array
    weights_N: Float32Array
    offsets_D1: Int64Array
    opaque_offsets_D1: Int64Array
    opaque_pos_C: Int64Array
    opaque_len_C: Int64Array
    opaque_chunks_C: Sequence[ModelInputChunk] = ()

    @property
    def n_datums(self) -> int:
        return len(self.offsets_D1) - 1

    def model_input(self, d: int, /) -> tinker.ModelInput:
        """The model input of datum ``d``."""
        return datum_model_input(self, d)

    def to_datums(self) -> list[tinker.Datum]:
        """``tinker.Datum`` objects with ``target_tokens`` and ``weights`` (views, no copies)."""
        return packed_datums(self, {"target_tokens": self.target_tokens_N, "weights": self.weights_N})


def from_packed(cls: type[A], packed: object) -> A:
    """An instance of the attrs class ``cls`` whose every field is the same-named attribute of
    ``packed`` (an object of the Rust core's, e.g. its columnar arrays: no copies)."""
    return cls(**{f.name: getattr(packed, f.name) for f in attrs.fields(cls)})


def _pack(
    model_inputs: Sequence[tinker.ModelInput], weights: Sequence[FloatArray], max_length: int | None
) -> SupervisedBatch:
    return from_packed(SupervisedBatch, _core.pack_examples(model_inputs, weights, max_length=max_length))


def examples_to_batch(
    examples: Sequence[SupervisedExample], *, max_length: int | None = None
) -> SupervisedBatch:
    """Many rendered conversations → one columnar batch (one Rust call)."""
    return _pack([e.model_input for e in examples], [e.weights for e in examples], max_length)


def examples_to_datums(
    examples: Sequence[SupervisedExample], *, max_length: int | None = None
) -> list[tinker.Datum]:
    """Many rendered conversations → ``tinker.Datum`` objects, in order."""
    return examples_to_batch(examples, max_length=max_length).to_datums()


def datum_from_model_input_weights(
    model_input: tinker.ModelInput, weights: FloatArray, max_length: int | None = None
) -> tinker.Datum:
    """One conversation (tokens + a weight per token) → one datum (the Cookbook's function)."""
    return _pack([model_input], [weights], max_length).to_datums()[0]


def datum_from_example(example: SupervisedExample, max_length: int | None = None) -> tinker.Datum:
    """One rendered conversation → one datum."""
    return datum_from_model_input_weights(example.model_input, example.weights, max_length)


def conversations_to_datums(
    renderer: Renderer,
    conversations: Sequence[Sequence[Message]],
    train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE,
    *,
    max_length: int | None = None,
) -> list[tinker.Datum]:
    """Render the conversations (one batch tokenizer call) and pack them all in one Rust call."""
    from tempering.renderers import render_supervised_batch_sync

    examples = render_supervised_batch_sync(renderer, conversations, train_on_what)
    return examples_to_datums(examples, max_length=max_length)
