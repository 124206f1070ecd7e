"""Element types: the one table between Triton/KServe names ("FP32"), numpy dtypes and the wire enum.

The wire enum ``mcpapi.v2.tensor_pb2.DataType`` numbers its values ``TYPE_<NAME>`` after Triton's
model_config, so ``wire_value(name)`` and ``name_of(value)`` are lookups, not code.
BF16 has no numpy dtype: asking for one raises ``InvalidArgument`` saying so.
"""

from __future__ import annotations

import numpy as np

from mcpapi.v2 import tensor_pb2
from mcpcore.errors import InvalidArgument

__all__ = ["ITEMSIZE", "NAMES", "from_numpy", "name_of", "numpy_dtype", "wire_value"]

_NUMPY: dict[str, np.dtype | None] = {
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
    "BF16": None,
}
NAMES: frozenset[str] = frozenset(_NUMPY)
ITEMSIZE: dict[str, int] = {n: (d.itemsize if d is not None else 2) for n, d in _NUMPY.items()}
_FROM_NUMPY: dict[np.dtype, str] = {d: n for n, d in _NUMPY.items() if d is not None}
_WIRE: dict[str, int] = {n: tensor_pb2.DataType.Value(f"TYPE_{n}") for n in _NUMPY}
_BY_WIRE: dict[int, str] = {v: n for n, v in _WIRE.items()}


def _known(name: str) -> str:
    if name not in _NUMPY:
        raise InvalidArgument(f"unknown data type {name!r}; use one of {', '.join(sorted(_NUMPY))}")
    return name


def numpy_dtype(name: str) -> np.dtype:
    dtype = _NUMPY[_known(name)]
    if dtype is None:
        raise InvalidArgument(f"data type {name} has no numpy equivalent; send FP16 or FP32 instead")
    return dtype


def from_numpy(dtype: np.dtype) -> str:
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise InvalidArgument(
            f"numpy dtype {dtype} has no tensor type (native byte order only); use one of {sorted(_NUMPY)}"
        ) from None


def wire_value(name: str) -> int:
    return _WIRE[_known(name)]


def name_of(value: int) -> str:
    try:
        return _BY_WIRE[value]
    except KeyError:
        raise InvalidArgument(f"unknown wire data type {value}") from None
