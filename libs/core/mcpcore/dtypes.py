"""Element types: the one table between Triton/KServe names ("FP32"), numpy dtypes and the wire enum, and
the one encoding of a tensor's elements as bytes.

The wire enum ``mcpapi.v2.tensor_pb2.DataType`` numbers its values ``TYPE_<NAME>`` after Triton's
model_config, so ``wire_value(name)`` and ``name_of(value)`` are lookups, not code.

Invariants:
- BF16 is ``ml_dtypes.bfloat16`` (2 bytes, the upper half of an FP32), so BF16 tensors are numpy arrays
  like any other; numpy computes on them in FP32 and casts back.
- BYTES elements are ``bytes`` in an object array (a ``str`` is sent as its UTF-8). As bytes, a BYTES
  tensor is Triton's serialization: per element a 4-byte little-endian length, then that many bytes, in
  row-major order; ``from_bytes`` accepts exactly ``prod(shape)`` such elements that fill the buffer,
  and nothing else (a count the buffer cannot hold is refused before anything is allocated). An element
  ``to_bytes`` cannot encode is ``Internal``: clients' elements are always bytes, so a backend made it.
- Every other type is its elements' raw little-endian bytes, row-major; ``from_bytes`` views them (no
  copy, read-only) and ``to_bytes`` hands out the array's own buffer when it is contiguous.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import ml_dtypes
import numpy as np

from mcpapi.v2 import tensor_pb2
from mcpcore.errors import Internal, InvalidArgument

__all__ = [
    "BYTES",
    "NAMES",
    "from_bytes",
    "from_numpy",
    "name_of",
    "numpy_dtype",
    "to_bytes",
    "wire_of",
    "wire_value",
]

BYTES = "BYTES"
_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    BYTES: np.dtype(object),
}
NAMES: frozenset[str] = frozenset(_NUMPY)
_FROM_NUMPY: dict[np.dtype, str] = {d: n for n, d in _NUMPY.items()}
_WIRE: dict[str, int] = {n: tensor_pb2.DataType.Value(f"TYPE_{n}") for n in _NUMPY}
_BY_WIRE: dict[int, str] = {v: n for n, v in _WIRE.items()}
_WIRE_OF_NUMPY: dict[np.dtype, int] = {d: _WIRE[n] for n, d in _NUMPY.items()}
_LENGTH = struct.Struct("<I")


def _known(name: str) -> str:
    if name not in _NUMPY:
        raise InvalidArgument(f"unknown data type {name!r}; use one of {', '.join(sorted(_NUMPY))}")
    return name


def numpy_dtype(name: str) -> np.dtype:
    dtype = _NUMPY.get(name)
    return dtype if dtype is not None else _NUMPY[_known(name)]


def from_numpy(dtype: np.dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype.kind == "S":  # fixed-width numpy bytes: BYTES elements too
        return BYTES
    try:
        return _FROM_NUMPY[dtype]
    except KeyError:
        raise InvalidArgument(
            f"numpy dtype {dtype} has no tensor type (native byte order only); use one of {sorted(_NUMPY)}"
        ) from None


def wire_value(name: str) -> int:
    value = _WIRE.get(name)
    return value if value is not None else _WIRE[_known(name)]


def wire_of(dtype: np.dtype) -> int:
    """``wire_value(from_numpy(dtype))``: one lookup for an array's own dtype."""
    value = _WIRE_OF_NUMPY.get(dtype)
    return value if value is not None else wire_value(from_numpy(dtype))


def name_of(value: int) -> str:
    try:
        return _BY_WIRE[value]
    except KeyError:
        raise InvalidArgument(f"unknown wire data type {value}") from None


# --- elements as bytes --------------------------------------------------------------------------------


def to_bytes(array: np.ndarray) -> Any:
    """The tensor's bytes: a buffer of the array itself (numeric, copied only if not contiguous or not
    little-endian) or, for BYTES, the length-prefixed serialization."""
    if array.dtype.kind in "OS":
        return _serialize(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array.reshape(-1).view(np.uint8).data  # as bytes: BF16 has no buffer-protocol format


def from_bytes(name: str, buf: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    """The tensor of type ``name`` and ``shape`` held in ``buf``; ``InvalidArgument`` naming ``what``
    when the bytes are not exactly that."""
    view = memoryview(buf).cast("B")
    count = math.prod(shape)
    if name == BYTES:
        return _deserialize(view, count, what).reshape(shape)
    dtype = numpy_dtype(name)
    need = count * dtype.itemsize
    if view.nbytes != need:
        raise InvalidArgument(f"{what}: {view.nbytes} bytes, but shape {list(shape)} of {name} needs {need}")
    return np.frombuffer(view, dtype=dtype).reshape(shape)  # hosts are little-endian


def _element(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview, np.bytes_)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise Internal(f"{what}: a BYTES element is {type(value).__name__}, not bytes or str")


def _serialize(array: np.ndarray) -> bytes:
    parts = []
    for value in array.reshape(-1):
        data = _element(value, "tensor")
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def _deserialize(view: memoryview, count: int, what: str) -> np.ndarray:
    if count > view.nbytes // _LENGTH.size:  # every element takes its 4-byte length at least
        raise InvalidArgument(
            f"{what}: {count} BYTES elements cannot fit in {view.nbytes} bytes (each takes 4 or more)"
        )
    out = np.empty(count, dtype=object)
    at, size = 0, view.nbytes
    for i in range(count):
        if at + 4 > size:
            raise InvalidArgument(
                f"{what}: BYTES data ends after {i} of {count} elements; each element is a 4-byte "
                "little-endian length, then that many bytes"
            )
        (length,) = _LENGTH.unpack_from(view, at)
        at += 4
        if at + length > size:
            raise InvalidArgument(
                f"{what}: BYTES element {i} says {length} bytes but only {size - at} remain"
            )
        out[i] = bytes(view[at : at + length])
        at += length
    if at != size:
        raise InvalidArgument(f"{what}: {size - at} bytes left over after {count} BYTES elements")
    return out
