"""KServe's protobuf tensors and numpy: a ModelInferRequest's inputs as arrays, a result as a
ModelInferResponse (gRPC's door; ``kserve_grpc_wire`` moves the bytes).

Invariants:
- Raw input bytes become arrays with ``dtypes.from_bytes`` (numeric: a read-only view, no copy; BYTES:
  Triton's length-prefixed elements, in ``raw_input_contents`` or ``contents.bytes_contents``). Raw bytes
  are little-endian on the wire, read and written as such. Typed ``contents`` (the slow path) are copied
  after a range check.
- Inputs and outputs may live in system shared memory regions registered with this router
  (``shm_regions``); raw entries belong, in order, to the inputs that are not in shared memory.
- Classification outputs are refused; every refusal is ``InvalidArgument`` naming the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mcp_router.dataplane import InferResult
from mcp_router.frontends.kserve_codec import (
    BYTES_ELEMENT,
    DEFAULT_MAX_TENSOR_BYTES,
    check_shape,
    shm_reference,
)
from mcp_router.frontends.shm_regions import SharedMemory
from mcpapi.kserve import grpc_service_pb2 as pb
from mcpcore import dtypes
from mcpcore.errors import Internal, InvalidArgument

__all__ = ["decode_inputs", "encode_response", "param_value", "requested_outputs", "whole"]

_TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# The element type of each field, so values are range-checked before narrowing (INT8 from int32).
_FIELD_DTYPE = {
    "bool_contents": np.bool_,
    "int_contents": np.int32,
    "int64_contents": np.int64,
    "uint_contents": np.uint32,
    "uint64_contents": np.uint64,
    "fp32_contents": np.float32,
    "fp64_contents": np.float64,
}


def decode_inputs(
    request: pb.ModelInferRequest,
    shm: SharedMemory | None = None,
    raw: Sequence[Any] | None = None,
    max_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
) -> dict[str, np.ndarray]:
    """The request's input tensors by name, from its raw entries (``raw``, else its own
    ``raw_input_contents``), typed ``contents`` or a system shared memory region registered with ``shm``;
    no tensor's shape spans more than ``max_bytes``."""
    if raw is None:
        raw = request.raw_input_contents
    # raw entries belong, in order, to the inputs that are not in shared memory (as tritonclient sends them)
    tensors = request.inputs
    shared = [bool(t.parameters) and "shared_memory_region" in t.parameters for t in tensors]
    if raw and len(raw) != len(tensors) - sum(shared):
        raise InvalidArgument(
            f"raw_input_contents has {len(raw)} entries but the request has {len(tensors) - sum(shared)} "
            "inputs not in shared memory; send one entry per such input, in the order of inputs"
        )
    arrays: dict[str, np.ndarray] = {}
    next_raw = 0
    for tensor, in_shm in zip(tensors, shared, strict=True):
        if tensor.name in arrays:
            raise InvalidArgument(f"input {tensor.name} appears twice; send each input once")
        entry = None
        if raw and not in_shm:
            entry, next_raw = raw[next_raw], next_raw + 1
        arrays[tensor.name] = _decode_tensor(tensor, entry, shm, in_shm, max_bytes)
    return arrays


def _decode_tensor(
    tensor: pb.ModelInferRequest.InferInputTensor,
    raw: Any,
    shm: SharedMemory | None,
    in_shm: bool,
    max_bytes: int,
) -> np.ndarray:
    name = tensor.name
    dtype = _input_dtype(name, tensor.datatype)
    itemsize = BYTES_ELEMENT if tensor.datatype == dtypes.BYTES else dtype.itemsize
    shape = check_shape(f"input {name}", tuple(tensor.shape), tensor.datatype, itemsize, max_bytes)
    if in_shm:
        if shm is None:
            raise InvalidArgument(f"input {name}: shared memory is not supported; send raw_input_contents")
        region, offset, size = shm_reference(
            {k: param_value(p) for k, p in tensor.parameters.items()}, f"input {name}"
        )
        return shm.read(region, offset, size, datatype=tensor.datatype, shape=shape, what=f"input {name}")
    count = math.prod(shape)
    typed = [d.name for d, _ in tensor.contents.ListFields()] if tensor.HasField("contents") else []
    if raw is not None:
        if typed:
            raise InvalidArgument(
                f"input {name}: has both contents and a raw_input_contents entry; send one of them"
            )
        if tensor.datatype != dtypes.BYTES and len(raw) != count * dtype.itemsize:
            raise InvalidArgument(
                f"input {name}: raw content is {len(raw)} bytes but shape {list(shape)} of "
                f"{tensor.datatype} needs {count * dtype.itemsize}"
            )
        return dtypes.from_bytes(tensor.datatype, raw, shape, f"input {name}")
    return _typed_array(tensor, dtype, shape, typed)


def _input_dtype(name: str, datatype: str) -> np.dtype:
    try:
        return dtypes.numpy_dtype(datatype)
    except InvalidArgument as err:
        raise InvalidArgument(f"input {name}: {err.message}") from None


def _typed_array(
    tensor: pb.ModelInferRequest.InferInputTensor, dtype: np.dtype, shape: tuple[int, ...], typed: list[str]
) -> np.ndarray:
    name, datatype, count = tensor.name, tensor.datatype, math.prod(shape)
    slot = _TYPED_FIELD.get(datatype)
    if not typed:
        if count == 0:
            return np.empty(shape, dtype)
        raise InvalidArgument(
            f"input {name}: no data; send raw_input_contents (one entry per input) or contents"
        )
    if slot is None:
        raise InvalidArgument(
            f"input {name}: {datatype} has no typed contents field; send raw_input_contents"
        )
    if typed != [slot]:
        raise InvalidArgument(f"input {name}: {datatype} elements go in contents.{slot}, not {typed}")
    if slot == "bytes_contents":
        values = np.empty(len(tensor.contents.bytes_contents), dtype=object)
        values[:] = list(tensor.contents.bytes_contents)
    else:
        values = np.array(getattr(tensor.contents, slot), dtype=_FIELD_DTYPE[slot])
    if values.size != count:
        raise InvalidArgument(
            f"input {name}: contents has {values.size} elements but shape {list(shape)} needs {count}"
        )
    if dtype.kind in "iu" and values.size:
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise InvalidArgument(f"input {name}: a value in contents.{slot} is out of range for {datatype}")
    return values.astype(dtype, copy=False).reshape(shape)


def requested_outputs(
    request: pb.ModelInferRequest,
) -> tuple[tuple[str, ...], dict[str, tuple[str, int, int]]]:
    """The outputs asked for by name, and those to write into shared memory (name -> region, offset,
    byte size)."""
    names, into_shm = [], {}
    for out in request.outputs:
        if "classification" in out.parameters:
            raise InvalidArgument(f"output {out.name}: parameter 'classification' is not supported")
        if "shared_memory_region" in out.parameters:
            values = {k: param_value(p) for k, p in out.parameters.items()}
            into_shm[out.name] = shm_reference(values, f"output {out.name}")
        names.append(out.name)
    return tuple(names), into_shm


def param_value(param: pb.InferParameter) -> bool | int | float | str | None:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


def encode_response(
    result: InferResult,
    request_id: str,
    requested: tuple[str, ...],
    into_shm: Mapping[str, tuple[str, int, int]] | None = None,
    shm: SharedMemory | None = None,
) -> tuple[pb.ModelInferResponse, list[Any]]:
    """The response without its raw output entries, and those entries (each output's own buffer, or b""
    for one written to shared memory): ``kserve_grpc_wire.serialize_response`` copies them at most once,
    into the bytes grpc sends; ``whole`` puts them in the message (a stream's answers)."""
    response = pb.ModelInferResponse(model_name=result.model, model_version=result.version, id=request_id)
    raw: list[Any] = []
    # the DataPlane checked the requested names: one it left out is a secondary output off at breaker
    # level 2, left out of the answer too
    for name in [n for n in requested if n in result.outputs] if requested else tuple(result.outputs):
        array = result.outputs[name]
        try:
            datatype = dtypes.from_numpy(array.dtype)
        except InvalidArgument as err:
            raise Internal(f"output {name} of model {result.model}: {err.message}") from None
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        data = dtypes.to_bytes(array)
        target = (into_shm or {}).get(name)
        if target is not None and shm is not None:  # written there; an empty entry keeps the indices
            region, offset, size = target
            shm.write(region, offset, size, data, what=f"output {name}")
            raw.append(b"")
        else:
            raw.append(data)
    return response, raw


def whole(response: pb.ModelInferResponse, raw: list[Any]) -> pb.ModelInferResponse:
    response.raw_output_contents.extend(bytes(data) for data in raw)
    return response
