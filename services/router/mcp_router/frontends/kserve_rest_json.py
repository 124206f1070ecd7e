"""Triton's JSON for the KServe V2 REST door: request bodies (JSON, or JSON then the binary tensor data
extension's bytes) to numpy, results back, and protobuf messages (ModelConfig, statistics) as Triton's JSON.

Invariants:
- JSON is read as the standard library reads it (what it accepts and its errors), by orjson where that
  gives the same document (``loads``); a body that is not JSON, or binary data that does not add up, is
  ``InvalidArgument`` naming what is wrong.
- Binary inputs are views of the body (no copy): ``binary_data_size`` bytes each, in input order, and every
  byte of the binary part belongs to one input.
- FP16 and BF16 travel as binary data only; a BYTES output that is not UTF-8 goes as binary data; NaN and
  Infinity are written as Triton writes them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from aiohttp import web
from google.protobuf import json_format

from mcp_router.dataplane import InferResult
from mcp_router.frontends.kserve_codec import (
    BYTES_ELEMENT,
    DEFAULT_MAX_TENSOR_BYTES,
    check_shape,
    shm_reference,
)
from mcp_router.frontends.shm_regions import SharedMemory
from mcpcore import dtypes
from mcpcore.errors import Internal, InvalidArgument

__all__ = [
    "HEADER_LENGTH",
    "as_json",
    "decode_inputs",
    "dumps",
    "encode_result",
    "loads",
    "read_json",
    "requested_outputs",
    "split_body",
]

#: The binary tensor data extension's header: the length of the JSON part of the body.
HEADER_LENGTH = "Inference-Header-Content-Length"
# Fields of Triton's JSON that are 64-bit integers: protobuf's JSON writes those as strings, Triton (and
# its clients) as numbers.
_INT64_FIELDS = frozenset(
    {
        "dims",
        "versions",
        "max_queue_delay_microseconds",
        "default_timeout_microseconds",
        "priority_levels",
        "default_priority_level",
        "last_inference",
        "inference_count",
        "execution_count",
        "count",
        "ns",
        "batch_size",
        "byte_size",
        "id",
    }
)


def _numbers(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _numbers(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v, key) for v in value]
    if key in _INT64_FIELDS and isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def as_json(message: Any) -> Any:
    return _numbers(
        json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    )


# What orjson would read otherwise than the standard library, found in one pass that maps every digit to 9
# and "{" to "[": 19 digits in a row (maybe an integer past 64 bits, which orjson reads as a float; 18 never
# are), and enough brackets to nest past where the standard library stops (its recursion limit), which
# orjson reads up to 1,024 levels deep and whose values then break whatever recurses over them.
_NORMALISED = bytes.maketrans(b"0123456789{", b"9999999999[")
_LONG_DIGITS = b"9" * 19
_MANY_BRACKETS = 256


def loads(raw: bytes) -> Any:
    """A JSON document, read as the standard library reads it: by orjson, or by the standard library where
    orjson would read it otherwise
    (integers past 64 bits; 256 brackets or more, which may nest deeper than the standard library reads)
    or refuses it (``NaN``, ``Infinity`` and numbers past the float range, a BOM, UTF-16 or UTF-32, lone
    surrogates), so what is accepted, and the error for what is not, stay the standard library's; but a
    number past the float range is refused (the standard library would read it as infinity)."""
    normalised = raw.translate(_NORMALISED)
    if _LONG_DIGITS not in normalised and normalised.count(b"[") < _MANY_BRACKETS:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw, parse_float=_finite)


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent; one past the float range (``1e400``) is refused, not
    read as infinity (``Infinity``, written so, is a constant and stays one)."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is past the range of a 64-bit float")
    return value


def dumps(doc: dict[str, Any], *, finite: bool) -> bytes:
    """``doc`` as compact JSON: by orjson when it writes what the standard library would (it writes a
    non-finite float as ``null``, so ``finite`` says there is none), else by the standard library, which
    writes ``NaN`` and ``Infinity`` as Triton's REST API does."""
    if finite:
        try:
            return orjson.dumps(doc)
        except orjson.JSONEncodeError:  # a string with lone surrogates, an integer past 64 bits
            pass
    return json.dumps(doc, separators=(",", ":")).encode()


async def read_json(request: web.Request, *, allow_empty: bool = False) -> dict[str, Any]:
    raw = await request.read()
    if not raw and allow_empty:
        return {}
    try:
        body = loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"the request body is not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return body


def split_body(request: web.Request, body: bytes) -> tuple[Any, memoryview]:
    """(the JSON part, parsed; the binary part) of an inference request."""
    length = request.headers.get(HEADER_LENGTH)
    view = memoryview(body)
    if length is None:
        cut = len(body)
    else:
        try:
            cut = int(length)
        except ValueError:
            raise InvalidArgument(f"{HEADER_LENGTH} is {length!r}, not a number of bytes") from None
        if not 0 <= cut <= len(body):
            raise InvalidArgument(f"{HEADER_LENGTH} is {cut} but the body has {len(body)} bytes")
    try:
        header = loads(view[:cut].tobytes())
    except (ValueError, RecursionError) as exc:
        why = str(exc)[:200]
        raise InvalidArgument(
            f"the inference request's JSON does not parse ({type(exc).__name__}: {why})"
        ) from None
    return header, view[cut:]


def decode_inputs(
    specs: Any, binary: memoryview, shm: SharedMemory, max_bytes: int = DEFAULT_MAX_TENSOR_BYTES
) -> dict[str, np.ndarray]:
    """The inputs by name (JSON data, binary data or shared memory); no tensor's shape spans more than
    ``max_bytes``, and a number is refused where it does not fit its datatype."""
    if not isinstance(specs, list) or not specs:
        raise InvalidArgument("inputs must be a non-empty list of tensors")
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict):
            raise InvalidArgument(f"inputs[{i}] must be a JSON object")
        name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"inputs[{i}] has no name")
        if name in arrays:
            raise InvalidArgument(f"input {name} appears twice; send each input once")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in shape
        ):
            raise InvalidArgument(f"input {name}: shape must be a list of non-negative integers")
        try:
            dtype = dtypes.numpy_dtype(datatype)
        except (InvalidArgument, TypeError, KeyError):
            raise InvalidArgument(f"input {name}: unknown datatype {datatype!r}") from None
        itemsize = BYTES_ELEMENT if datatype == dtypes.BYTES else dtype.itemsize
        check_shape(f"input {name}", tuple(shape), datatype, itemsize, max_bytes)
        count = math.prod(shape)
        text = datatype == dtypes.BYTES
        params = spec.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if isinstance(params, dict) and "shared_memory_region" in params:
            region, shm_offset, shm_size = shm_reference(params, f"input {name}")
            what = f"input {name}"
            arrays[name] = shm.read(
                region, shm_offset, shm_size, datatype=datatype, shape=tuple(shape), what=what
            )
            continue
        if size is not None:
            arrays[name] = _binary_input(name, datatype, tuple(shape), size, binary=binary, offset=offset)
            offset += size
            continue
        if datatype in ("FP16", "BF16"):
            raise InvalidArgument(f"input {name}: {datatype} travels as binary data only (binary_data_size)")
        if "data" not in spec:
            raise InvalidArgument(f"input {name} has neither data nor binary_data_size")
        try:
            array = _strings(spec["data"], name) if text else np.asarray(spec["data"], dtype=dtype)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise InvalidArgument(f"input {name}: data is not {datatype} ({exc})") from None
        if dtype.kind == "f" and not np.isfinite(array).all():
            _check_floats(name, datatype, spec["data"], array)
        if array.size != count:
            raise InvalidArgument(f"input {name}: {array.size} values for shape {shape} ({count} needed)")
        arrays[name] = array.reshape(shape)
    if offset != len(binary):
        raise InvalidArgument(f"{len(binary) - offset} bytes of binary data belong to no input")
    return arrays


def _binary_input(
    name: str, datatype: str, shape: tuple[int, ...], size: Any, *, binary: memoryview, offset: int
) -> np.ndarray:
    """An input sent as binary data: its ``size`` bytes from ``offset`` in the binary part."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidArgument(f"input {name}: binary_data_size {size!r} is not a number of bytes")
    if datatype != dtypes.BYTES:
        need = math.prod(shape) * dtypes.numpy_dtype(datatype).itemsize
        if size != need:
            raise InvalidArgument(
                f"input {name}: binary_data_size {size!r} but shape {list(shape)} of {datatype} needs "
                f"{need} bytes"
            )
    if offset + size > len(binary):
        raise InvalidArgument(
            f"input {name}: binary data ends at byte {len(binary)}; {offset + size} are needed"
        )
    return dtypes.from_bytes(datatype, binary[offset : offset + size], shape, f"input {name}")


def _check_floats(name: str, datatype: str, data: Any, array: np.ndarray) -> None:
    """A number that is finite in the JSON but not in ``datatype`` (1e39 as FP32) does not fit it:
    refused, as an integer past its type's range is. NaN and Infinity, written as such, pass."""
    with np.errstate(over="ignore", invalid="ignore"):
        wide = np.asarray(data, dtype=np.float64)
    if (np.isfinite(wide) & ~np.isfinite(array)).any():
        raise InvalidArgument(f"input {name}: a value in data is out of range for {datatype}")


def _strings(data: Any, name: str) -> np.ndarray:
    """BYTES elements from JSON: strings (sent as their UTF-8), in nested lists or flat."""
    flat: list[bytes] = []
    stack = [data]
    while stack:  # row-major order, without recursion a hostile nesting could exhaust
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, str):
            flat.append(item.encode())
        else:
            raise InvalidArgument(f"input {name}: BYTES data are strings, got {type(item).__name__}")
    array = np.empty(len(flat), dtype=object)
    array[:] = flat
    return array


def _json_strings(array: np.ndarray) -> list[str] | None:
    """A BYTES output's elements as JSON strings, or None when one is not UTF-8 (it goes as binary)."""
    try:
        return [bytes(v).decode() if not isinstance(v, str) else v for v in array.reshape(-1)]
    except UnicodeDecodeError:
        return None


def requested_outputs(
    specs: Any, params: Mapping[str, Any]
) -> tuple[list[str], set[str], dict[str, tuple[str, int, int]]]:
    """The outputs asked for (empty: all), which of them go back as binary data, and which go into
    shared memory (name -> region, offset, byte size)."""
    default_binary = params.get("binary_data_output") is True
    if specs is None:
        return [], ({"*"} if default_binary else set()), {}
    if not isinstance(specs, list):
        raise InvalidArgument("outputs must be a list")
    names, binary, into_shm = [], set(), {}
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidArgument(f"outputs[{i}] must be an object with a name")
        p = spec.get("parameters") or {}
        if not isinstance(p, dict):
            raise InvalidArgument(f"outputs[{i}].parameters must be an object")
        if "classification" in p:
            raise InvalidArgument(f"output {spec['name']}: classification is not supported")
        names.append(spec["name"])
        if "shared_memory_region" in p:
            into_shm[spec["name"]] = shm_reference(p, f"output {spec['name']}")
        elif p.get("binary_data", default_binary) is True:
            binary.add(spec["name"])
    return names, binary, into_shm


def encode_result(
    result: InferResult,
    request_id: str,
    requested: list[str],
    binary: set[str],
    *,
    into_shm: Mapping[str, tuple[str, int, int]],
    shm: SharedMemory,
) -> web.Response:
    names = [n for n in requested if n in result.outputs] if requested else list(result.outputs)
    outputs, blobs = [], []
    finite = True  # every float written as JSON data is (``dumps``)
    for name in names:
        array = result.outputs[name]
        try:
            datatype = dtypes.from_numpy(array.dtype)
        except InvalidArgument as err:
            raise Internal(f"output {name} of model {result.model}: {err.message}") from None
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        target = into_shm.get(name)
        strings = _json_strings(array) if datatype == dtypes.BYTES else None
        if target is not None:  # written into the client's region: the reply carries its shape only
            region, offset, size = target
            shm.write(region, offset, size, dtypes.to_bytes(array), what=f"output {name}")
        elif (
            name in binary
            or "*" in binary
            or datatype in ("FP16", "BF16")
            or (datatype == dtypes.BYTES and strings is None)  # not UTF-8: JSON cannot carry it
        ):
            blob = bytes(dtypes.to_bytes(array))
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            if array.dtype.kind == "f" and finite:
                finite = bool(np.isfinite(array).all())
            entry["data"] = strings if strings is not None else array.reshape(-1).tolist()
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": result.model, "model_version": result.version, "outputs": outputs}
    if request_id:
        doc["id"] = request_id
    head = dumps(doc, finite=finite)
    if not blobs:
        return web.Response(body=head, content_type="application/json")
    return web.Response(
        body=b"".join([head, *blobs]),
        headers={HEADER_LENGTH: str(len(head))},
        content_type="application/octet-stream",
    )
