"""Protobuf on the wire: ``forward_backward`` requests in, ``forward_backward`` and ``asample``
results out, in the SDK's own schema (``tinker.proto.tinker_public_pb2``).

The SDK sends ``forward_backward`` only as protobuf and accepts the results of
``forward_backward`` and ``asample`` only as protobuf (it rejects JSON for them), so these three
conversions are the whole binary surface of the server. Tensors travel as raw little-endian
bytes; a batch of per-datum tensors as one buffer plus ``N + 1`` int64 *byte* offsets. A 2-D
loss input may come as sparse CSR (the SDK encodes a 2-D torch tensor so when that is smaller:
values, int64 row pointers and column indices); it is densified here, with 0 in the unlisted
cells as the SDK's ``TensorData.to_numpy()`` does, after checking its indices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tinker
from tinker import types as ttypes
from tinker.proto import tinker_public_pb2 as pb
from tinker.types.topk_logprobs import TopkLogprobs

from tempering.local.scores import dense_from_csr

__all__ = [
    "ForwardBackwardCall",
    "WireError",
    "check_sparse_inputs",
    "decode_forward_backward",
    "encode_forward_backward_output",
    "encode_sample_response",
    "proto_datums",
]

_NUMPY_OF_DTYPE: dict[int, np.dtype[np.generic]] = {
    pb.DTYPE_FLOAT32: np.dtype(np.float32),
    pb.DTYPE_INT64: np.dtype(np.int64),
    pb.DTYPE_INT32: np.dtype(np.int32),
}


class WireError(ValueError):
    """A request whose bytes don't decode to what the SDK sends (answered with a 400)."""


@dataclass(frozen=True)
class ForwardBackwardCall:
    """A decoded ``/forward_backward`` request; ``message`` keeps the datums undecoded so that
    converting them (the costly part) runs on the model's queue, off the event loop."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str] | None
    forward_only: bool
    message: pb.ForwardBackwardRequest


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """Parse the protobuf body of ``/forward_backward``; raises :class:`WireError`."""
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # google.protobuf.message.DecodeError, and others on garbage
        raise WireError(
            f"forward_backward: the body is not a ForwardBackwardRequest protobuf ({exc})"
        ) from exc
    if not message.model_id:
        raise WireError("forward_backward: model_id is missing")
    config: dict[str, float | str] | None = None
    if message.loss_fn_config_v2:
        config = {}
        for key, value in message.loss_fn_config_v2.items():
            config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    elif message.loss_fn_config:
        config = {key: float(v) for key, v in message.loss_fn_config.items()}
    return ForwardBackwardCall(
        model_id=message.model_id,
        seq_id=int(message.seq_id),
        loss_fn=message.loss_fn,
        loss_fn_config=config,
        forward_only=bool(message.forward_only),
        message=message,
    )


def check_sparse_inputs(message: pb.ForwardBackwardRequest) -> None:
    """Raise :class:`WireError` for a malformed sparse CSR loss input (so that it is refused
    with a 400 before the request is queued, rather than failing on the model's queue)."""
    for d, datum in enumerate(message.data):
        for name, tensor in datum.loss_fn_inputs.items():
            if tensor.WhichOneof("encoding") == "sparse_csr":
                _tensor(tensor, f"forward_backward: datum {d}, field {name!r}")


def _tensor(msg: pb.Tensor, where: str) -> tinker.TensorData:
    np_dtype = _NUMPY_OF_DTYPE.get(msg.dtype)
    if np_dtype is None:
        raise WireError(f"{where}: unsupported tensor dtype {msg.dtype}")
    if msg.WhichOneof("encoding") == "sparse_csr":
        return tinker.TensorData.from_numpy(_sparse(msg, np_dtype, where))
    if len(msg.dense) % np_dtype.itemsize:
        raise WireError(f"{where}: {len(msg.dense)} bytes is not a whole number of {np_dtype} values")
    array = np.frombuffer(msg.dense, dtype=np_dtype)
    if np_dtype == np.int32:
        array = array.astype(np.int64)
    shape = [int(s) for s in msg.shape] or [array.size]
    if int(np.prod(shape)) != array.size:
        raise WireError(f"{where}: shape {shape} does not hold {array.size} values")
    return tinker.TensorData.from_numpy(array.reshape(shape).copy())


def _sparse(msg: pb.Tensor, np_dtype: np.dtype[np.generic], where: str) -> np.ndarray:
    """A sparse CSR tensor densified (0 in the unlisted cells); a malformed one is a WireError."""
    csr = msg.sparse_csr
    for name, raw, size in (
        ("values", csr.values, np_dtype.itemsize),
        ("row pointers", csr.crow_indices, 8),
        ("column indices", csr.col_indices, 8),
    ):
        if len(raw) % size:
            raise WireError(f"{where}: sparse CSR {name}: {len(raw)} bytes is not a whole number of values")
    values = np.frombuffer(csr.values, dtype=np_dtype)
    if np_dtype == np.int32:
        values = values.astype(np.int64)
    crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
    col = np.frombuffer(csr.col_indices, dtype=np.int64)
    try:
        return dense_from_csr(values, crow, col, [int(s) for s in msg.shape], 0, where)
    except ValueError as exc:
        raise WireError(str(exc)) from exc


def proto_datums(message: pb.ForwardBackwardRequest) -> list[tinker.Datum]:
    """The request's datums as ``tinker.Datum`` (token chunks only, as the local engine reads)."""
    data: list[tinker.Datum] = []
    for d, datum in enumerate(message.data):
        chunks: list[ttypes.ModelInputChunk] = []
        for chunk in datum.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise WireError(f"datum {d}: {kind} chunks are not supported by the local engine")
            raw = chunk.encoded_text.tokens
            if len(raw) % 4:
                raise WireError(f"datum {d}: token bytes are not a whole number of int32 values")
            tokens = np.frombuffer(raw, dtype=np.int32).tolist()
            chunks.append(tinker.EncodedTextChunk(tokens=tokens))
        inputs = {
            name: _tensor(tensor, f"datum {d}, field {name!r}")
            for name, tensor in datum.loss_fn_inputs.items()
        }
        data.append(tinker.Datum(model_input=tinker.ModelInput(chunks=chunks), loss_fn_inputs=inputs))
    return data


def _batched(arrays: Sequence[np.ndarray], dtype: np.dtype[np.generic]) -> pb.BatchedTensor:
    """One buffer and ``N + 1`` int64 byte offsets for arrays of one dtype and trailing shape."""
    flat = [np.ascontiguousarray(a, dtype=dtype).reshape(-1) for a in arrays]
    sizes = np.fromiter((a.nbytes for a in flat), dtype=np.int64, count=len(flat))
    offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes, dtype=np.int64)])
    proto_dtype = pb.DTYPE_FLOAT32 if dtype == np.float32 else pb.DTYPE_INT64
    return pb.BatchedTensor(
        data=b"".join(a.tobytes() for a in flat),
        offsets=offsets.tobytes(),
        dtype=proto_dtype,
        trailing_shape=list(arrays[0].shape[1:]) if arrays else [],
    )


def encode_forward_backward_output(output: ttypes.ForwardBackwardOutput) -> bytes:
    """A ``ForwardBackwardOutput`` as the SDK's protobuf.

    Datums whose outputs share dtype and trailing shape go in one ``ArrayRecord``; a change
    (1-D and 2-D targets mixed in one batch) starts the next record, as the SDK's reader allows.
    """
    message = pb.ForwardBackwardOutput(loss_fn_output_type=output.loss_fn_output_type)
    for key, value in output.metrics.items():
        message.metrics[key] = float(value)
    outputs: list[Mapping[str, tinker.TensorData]] = list(output.loss_fn_outputs)
    start = 0
    while start < len(outputs):
        names = sorted(outputs[start])
        arrays = [{n: outputs[start][n].to_numpy() for n in names}]
        signature = {n: (a.dtype, a.shape[1:]) for n, a in arrays[0].items()}
        end = start + 1
        while end < len(outputs) and sorted(outputs[end]) == names:
            candidate = {n: outputs[end][n].to_numpy() for n in names}
            if {n: (a.dtype, a.shape[1:]) for n, a in candidate.items()} != signature:
                break
            arrays.append(candidate)
            end += 1
        record = message.loss_fn_outputs.add(num_datums=end - start)
        for n in names:
            dtype = np.dtype(np.float32) if arrays[0][n].dtype.kind == "f" else np.dtype(np.int64)
            record.fields[n].CopyFrom(_batched([a[n] for a in arrays], dtype))
        start = end
    return message.SerializeToString()


def _topk(target: pb.TopkLogprobs, topk: TopkLogprobs) -> None:
    length, k = topk.token_ids.shape
    target.length, target.k = int(length), int(k)
    target.token_ids = np.ascontiguousarray(topk.token_ids, dtype=np.int32).tobytes()
    target.logprobs = np.ascontiguousarray(topk.logprobs, dtype=np.float32).tobytes()


def _tensor_out(target: pb.Tensor, tensor: tinker.TensorData) -> None:
    """A float32 ``TensorData`` (dense or sparse CSR) into the SDK's ``Tensor`` message."""
    target.dtype = pb.DTYPE_FLOAT32
    target.shape.extend(tensor.shape or [])
    values = np.asarray(tensor.data, dtype=np.float32)
    if tensor.sparse_crow_indices is not None and tensor.sparse_col_indices is not None:
        target.sparse_csr.values = values.tobytes()
        target.sparse_csr.crow_indices = np.asarray(tensor.sparse_crow_indices, dtype=np.int64).tobytes()
        target.sparse_csr.col_indices = np.asarray(tensor.sparse_col_indices, dtype=np.int64).tobytes()
    else:
        target.dense = values.tobytes()


def encode_sample_response(response: ttypes.SampleResponse) -> bytes:
    """A ``SampleResponse`` as the SDK's protobuf (int32 tokens, float32 logprobs; a missing
    prompt logprob, the first token's, travels as NaN), with the top-K matrices and target
    logprobs when they were asked for."""
    message = pb.SampleResponse()
    for seq in response.sequences:
        entry = message.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
        )
        if seq.logprobs is not None:
            entry.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
        if seq.topk_logprobs_np is not None:
            _topk(entry.topk_sampled_logprobs, seq.topk_logprobs_np)
    prompt = response.prompt_logprobs
    if prompt is not None:
        values = [np.nan if v is None else v for v in prompt]
        message.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    if response.topk_prompt_logprobs_np is not None:
        _topk(message.topk_prompt_logprobs, response.topk_prompt_logprobs_np)
    if response.target_prompt_logprobs is not None:
        _tensor_out(message.target_prompt_logprobs, response.target_prompt_logprobs)
    return message.SerializeToString()
