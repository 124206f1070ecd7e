"""The ZeroMQ tensor message format: ``[TensorHeader, tensor_0, tensor_1, ...]`` (DESIGN.md section 3).

Invariants:
- Tensor frames are ``dtypes.to_bytes``: raw little-endian row-major bytes, or BYTES' length-prefixed
  elements. ``encode`` hands out the arrays' own buffers (send them with ``copy=False``) and ``decode``
  returns read-only ``np.frombuffer`` views of the received frames: no copy either way. A non-contiguous
  array is the one numeric case ``encode`` copies (it must); BYTES tensors are always (de)serialized.
- ``decode`` trusts nothing: the header must parse, the frame count must equal the header's tensor count,
  and each frame's length must equal its ``byte_size`` and ``prod(shape) * itemsize`` (BYTES: hold exactly
  ``prod(shape)`` elements). A violation raises
  ``InvalidArgument`` (or ``ResourceExhausted`` past a size limit) naming the tensor, so a server answers it
  with ``error_reply`` and never crashes.
- A coalesced message (``KIND_BATCH``, DESIGN.md section 3) is ``coalesce``'d from whole single messages
  without parsing or re-serializing their headers, and ``uncoalesce`` parses all of its headers at once
  and gives each its own tensor frames; a receiver then treats each exactly as a single message.
- A tensor in a same-host sender's shared memory (``TensorSpec.shm``, ``transport.shm_lease``) has no frame:
  ``encode`` puts there what its ``place`` takes, and ``with_regions`` gives a receiver the frames again
  in the header's order, each such tensor as a view of the memory, so the checks above apply unchanged.
- This module does no I/O and imports no zmq: frames are anything with the buffer protocol, or objects with
  a ``.buffer`` memoryview (``zmq.Frame``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from mcpapi.v2 import tensor_pb2
from mcpcore import dtypes
from mcpcore.errors import InvalidArgument, MCPError, ResourceExhausted, error_for_code
from mcpcore.tensor_signature import tensor_name_problem

__all__ = [
    "FEATURE_BATCH",
    "FEATURE_LOCAL",
    "FEATURE_SHM",
    "FLAG_DIRECT",
    "FLAG_DRAINING",
    "FLAG_PARTIAL",
    "FLAG_RETRYABLE",
    "FLAG_SECONDARY_FEATURES_OFF",
    "FLAG_SHARED_MEMORY",
    "FLAG_TAKES_COALESCED",
    "KIND_BATCH",
    "PARAM_ANSWER",
    "PARAM_FEATURES_OFF",
    "PARAM_TRACEPARENT",
    "RESERVED_PREFIX",
    "SAME_HOST_FEATURES",
    "Limits",
    "Message",
    "client_parameters",
    "coalesce",
    "decode",
    "encode",
    "error_reply",
    "local_endpoint",
    "parse_header",
    "raise_for_status",
    "tensors_of",
    "uncoalesce",
    "with_regions",
]

TensorHeader = tensor_pb2.TensorHeader
FLAG_SECONDARY_FEATURES_OFF = tensor_pb2.FLAG_SECONDARY_FEATURES_OFF
FLAG_RETRYABLE = tensor_pb2.FLAG_RETRYABLE
FLAG_DRAINING = tensor_pb2.FLAG_DRAINING
FLAG_PARTIAL = tensor_pb2.FLAG_PARTIAL
FLAG_TAKES_COALESCED = tensor_pb2.FLAG_TAKES_COALESCED
FLAG_DIRECT = tensor_pb2.FLAG_DIRECT
FLAG_SHARED_MEMORY = tensor_pb2.FLAG_SHARED_MEMORY
SharedRegion = tensor_pb2.SharedRegion
KIND_BATCH = tensor_pb2.KIND_BATCH
#: The worker record's ``zmq_features`` entry saying it takes (and answers) coalesced messages.
FEATURE_BATCH = "batch"
#: The worker record's ``zmq_features`` entry saying its tensor socket also listens on a local endpoint
#: (``local_endpoint``): a sender on the same host reaches it there instead of through TCP.
FEATURE_LOCAL = "local"
#: The worker record's ``zmq_features`` entry saying it takes tensors in a sender's shared memory (and
#: writes outputs into the sender's reply region) from a sender on its local endpoint (``shm_lease``).
FEATURE_SHM = "shm"
#: What a record offers on its same-host endpoint only: a reader that does not take the offer (its
#: signature does not verify) drops them all.
SAME_HOST_FEATURES = frozenset({FEATURE_LOCAL, FEATURE_SHM})
#: Header parameters under this prefix are the mesh's own; every other one is a client's request
#: parameter, which the worker hands to the backend (``client_parameters``).
RESERVED_PREFIX = "mcp."
#: Header parameter a router adds with ``FLAG_SECONDARY_FEATURES_OFF``: the breaker policy's level-2
#: ``features``, comma-separated (absent: every secondary output of the model goes).
PARAM_FEATURES_OFF = RESERVED_PREFIX + "features_off"
#: Header parameter a router adds to a request it traces: the W3C traceparent of its span for the
#: request, under which the worker records its spans (``mcpcore.tracing``). Absent: not traced.
PARAM_TRACEPARENT = RESERVED_PREFIX + "traceparent"
#: Reply parameter of a ``FLAG_PARTIAL`` reply: its place among the request's answers (0, 1, ...), so a
#: receiver sees a gap (ZeroMQ drops what a full queue cannot take) instead of a silent hole.
PARAM_ANSWER = RESERVED_PREFIX + "answer"
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits for one message; DESIGN.md keeps tensor frames at or below 16 MiB."""

    max_header_bytes: int = 64 * 1024
    max_tensors: int = 64
    max_tensor_bytes: int = 16 * MiB
    max_message_bytes: int = 64 * MiB


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Message:
    header: tensor_pb2.TensorHeader
    tensors: tuple[np.ndarray, ...]
    shared: bool = False  # its request lent the worker shared memory (``mcpcore.transport.shm_lease``)

    def named(self) -> dict[str, np.ndarray]:
        return {spec.name: arr for spec, arr in zip(self.header.tensors, self.tensors, strict=True)}


def encode(
    header: tensor_pb2.TensorHeader,
    tensors: Mapping[str, np.ndarray] | Sequence[tuple[str, np.ndarray]],
    place: Callable[[np.ndarray], tensor_pb2.SharedRegion | None] | None = None,
) -> list[Any]:
    """Fill ``header.tensors`` from ``tensors`` and return the frames, header first.

    ``header`` is modified in place (its tensor list is replaced). Send the result with
    ``socket.send_multipart(frames, copy=False)``. ``place``: puts a tensor's bytes in shared memory and
    says where (``TensorSpec.shm``; it gets no frame), or returns None (it goes as a frame).
    """
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    specs = header.tensors
    if specs:
        del specs[:]
    frames: list[Any] = [b""]
    for name, array in items:
        if not isinstance(name, str):  # protobuf would take None as "no name"
            raise TypeError(f"a tensor name must be a str, not {type(name).__name__}")
        arr = array if type(array) is np.ndarray else np.asarray(array)
        kind = arr.dtype.kind
        wire_dtype = dtypes.wire_of(arr.dtype)
        if place is not None and kind in _NUMERIC and (region := place(arr)) is not None:
            specs.add(name=name, dtype=wire_dtype, shape=arr.shape, byte_size=arr.nbytes, shm=region)
            continue
        data = dtypes.to_bytes(arr)  # the array's own buffer (copied only if not contiguous), or BYTES'
        size = memoryview(data).nbytes if kind in "OS" else arr.nbytes
        specs.add(name=name, dtype=wire_dtype, shape=arr.shape, byte_size=size)
        frames.append(data)
    frames[0] = header.SerializeToString()
    return frames


_NUMERIC = frozenset("biufc")  # numpy kinds whose bytes are the tensor's (BYTES' are not)


def with_regions(
    header: tensor_pb2.TensorHeader,
    frames: Sequence[Any],
    view: Callable[[tensor_pb2.SharedRegion, str], memoryview],
    limits: Limits = DEFAULT_LIMITS,
) -> list[Any]:
    """The tensor frames of a message whose tensors may be in shared memory, one per tensor in the header's
    order: a frame that came, or ``view(spec.shm, name)`` (the region's bytes; it raises ``MCPError`` for
    a region it will not give). Each ``shm`` is cleared, so ``tensors_of`` then checks them as frames."""
    if len(header.tensors) > limits.max_tensors:
        raise ResourceExhausted(
            f"{len(header.tensors)} tensors in one message, over the limit of {limits.max_tensors}"
        )
    shared = sum(spec.HasField("shm") for spec in header.tensors)
    if len(header.tensors) - shared != len(frames):
        raise InvalidArgument(
            f"header lists {len(header.tensors) - shared} tensor frame(s) and {shared} tensor(s) in shared "
            f"memory, but {len(frames)} frame(s) arrived"
        )
    out: list[Any] = []
    at = 0
    for spec in header.tensors:
        if spec.HasField("shm"):
            region = spec.shm
            if region.size != spec.byte_size:
                raise InvalidArgument(
                    f"tensor {spec.name!r}: its shared-memory region holds {region.size} bytes but its "
                    f"byte_size is {spec.byte_size}"
                )
            out.append(view(region, spec.name))
            spec.ClearField("shm")
        else:
            out.append(frames[at])
            at += 1
    return out


def _buffer(frame: Any) -> memoryview:
    buf = getattr(frame, "buffer", None)
    return buf if isinstance(buf, memoryview) else memoryview(frame)


def parse_header(frame: Any, limits: Limits = DEFAULT_LIMITS) -> tensor_pb2.TensorHeader:
    buf = _buffer(frame)
    if buf.nbytes > limits.max_header_bytes:
        raise ResourceExhausted(
            f"header frame is {buf.nbytes} bytes, over the {limits.max_header_bytes}-byte limit"
        )
    header = tensor_pb2.TensorHeader()
    try:
        header.ParseFromString(buf)
    except DecodeError as exc:
        raise InvalidArgument(f"first frame is not a TensorHeader ({exc})") from exc
    return header


def decode(frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS) -> Message:
    """Validate a received multipart message and view its tensors without copying."""
    if not frames:
        raise InvalidArgument("empty message: expected [TensorHeader, tensor frames...]")
    header = parse_header(frames[0], limits)
    return Message(header, tensors_of(header, frames[1:], limits))


def tensors_of(
    header: tensor_pb2.TensorHeader, frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS
) -> tuple[np.ndarray, ...]:
    """The tensor frames checked against an already parsed header (so an error reply can name the
    request)."""
    specs = header.tensors
    if len(specs) > limits.max_tensors:
        raise ResourceExhausted(
            f"{len(specs)} tensors in one message, over the limit of {limits.max_tensors}"
        )
    if len(frames) != len(specs):
        if any(spec.HasField("shm") for spec in specs):
            raise InvalidArgument(
                "the message has tensors in a sender's shared memory, which only the sender's own host can "
                "read (a worker over its local endpoint, or the sender reading its reply region)"
            )
        raise InvalidArgument(
            f"header lists {len(specs)} tensor(s) but {len(frames)} tensor frame(s) arrived"
        )
    total = 0
    arrays = []
    for spec, frame in zip(specs, frames, strict=True):
        buf = _buffer(frame)
        total += buf.nbytes
        if total > limits.max_message_bytes:
            raise ResourceExhausted(f"message tensors exceed {limits.max_message_bytes} bytes in total")
        arrays.append(_view(spec, buf, limits))
    return tuple(arrays)


def _view(spec: tensor_pb2.TensorSpec, buf: memoryview, limits: Limits) -> np.ndarray:
    name = spec.name
    if name not in _GOOD_NAMES:  # checked once per name (names from the network: a bounded memory)
        if problem := tensor_name_problem(name):
            raise InvalidArgument(problem)
        if len(_GOOD_NAMES) < _GOOD_NAMES_MAX:
            _GOOD_NAMES.add(name)
    nbytes = buf.nbytes
    if nbytes > limits.max_tensor_bytes:
        raise ResourceExhausted(
            f"tensor {name!r} is {nbytes} bytes, over the {limits.max_tensor_bytes}-byte frame limit; "
            "split the batch"
        )
    dtype = dtypes.name_of(spec.dtype)
    shape = tuple(spec.shape)
    if shape and min(shape) < 0:
        raise InvalidArgument(f"tensor {name!r}: shape {list(shape)} has a negative dimension")
    if dtype == dtypes.BYTES:  # elements of any length: the frame must hold exactly prod(shape) of them
        expected = spec.byte_size
    else:
        expected = math.prod(shape) * dtypes.numpy_dtype(dtype).itemsize
        if spec.byte_size != expected:
            raise InvalidArgument(
                f"tensor {name!r}: byte_size {spec.byte_size} does not match shape {list(shape)} of "
                f"{dtype} ({expected} bytes)"
            )
    if nbytes != expected:
        raise InvalidArgument(f"tensor {name!r}: frame has {nbytes} bytes but its header says {expected}")
    return dtypes.from_bytes(dtype, buf, shape, f"tensor {name!r}")


#: Tensor names seen valid (``_view``): most messages repeat a model's few names.
_GOOD_NAMES: set[str] = set()
_GOOD_NAMES_MAX = 4096


# TensorHeader{kind: KIND_BATCH} as protobuf writes it: field 1 (varint) = 4; each sub-header is field 12
# (length-delimited). Concatenated fields are a valid serialization, so whole headers need no re-encoding.
_BATCH_KIND = bytes([1 << 3, KIND_BATCH])
_BATCH_TAG = bytes([(12 << 3) | 2])


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def coalesce(
    messages: Sequence[Sequence[Any]], limits: Limits = DEFAULT_LIMITS
) -> list[tuple[int, list[Any]]]:
    """Whole single messages (``[header bytes, tensor frames...]`` each, as ``encode`` returns them) as
    few messages as the limits allow, each with how many of them it holds, in order: several go as one
    ``KIND_BATCH`` message (their headers in one envelope, then all their tensor frames), at most
    ``max_tensors`` headers and ``max_header_bytes`` of envelope each; one alone goes as it is."""
    out: list[tuple[int, list[Any]]] = []
    group: list[Sequence[Any]] = []
    size = len(_BATCH_KIND)
    for message in messages:
        grows = len(message[0]) + 6  # its tag and length: at most 1 + 5 bytes
        if group and (len(group) == limits.max_tensors or size + grows > limits.max_header_bytes):
            out.append(_envelope(group))
            group, size = [], len(_BATCH_KIND)
        group.append(message)
        size += grows
    if group:
        out.append(_envelope(group))
    return out


def _envelope(messages: Sequence[Sequence[Any]]) -> tuple[int, list[Any]]:
    if len(messages) == 1:
        return 1, list(messages[0])
    parts = [_BATCH_KIND]
    frames: list[Any] = [b""]
    for message in messages:
        header = bytes(message[0])
        parts += (_BATCH_TAG, _varint(len(header)), header)
        frames.extend(message[1:])
    frames[0] = b"".join(parts)
    return len(messages), frames


def uncoalesce(
    envelope: tensor_pb2.TensorHeader, frames: Sequence[Any], limits: Limits = DEFAULT_LIMITS
) -> list[tuple[tensor_pb2.TensorHeader, Sequence[Any]]]:
    """Each coalesced header with its own tensor frames (``frames``: the envelope's, after its header).
    Raises ``InvalidArgument`` when the frames do not add up to the headers' tensors (nothing of the
    message can be trusted then; a receiver answers every header it names)."""
    if len(envelope.batch) > limits.max_tensors:
        raise ResourceExhausted(
            f"{len(envelope.batch)} messages coalesced in one, over the limit of {limits.max_tensors}"
        )
    out: list[tuple[tensor_pb2.TensorHeader, Sequence[Any]]] = []
    at = 0
    for header in envelope.batch:
        n = sum(not spec.HasField("shm") for spec in header.tensors)  # those in shared memory: no frame
        out.append((header, frames[at : at + n]))
        at += n
    if at != len(frames):
        raise InvalidArgument(
            f"a coalesced message's headers list {at} tensor(s) but {len(frames)} tensor frame(s) arrived"
        )
    if any(h.kind in (KIND_BATCH, tensor_pb2.KIND_CANCEL) for h in envelope.batch):
        raise InvalidArgument("a coalesced message may hold requests or replies, not a batch or a cancel")
    return out


def client_parameters(header: tensor_pb2.TensorHeader) -> dict[str, str]:
    """The request parameters a client sent (the header's, less the mesh's own)."""
    return {k: v for k, v in header.parameters.items() if not k.startswith(RESERVED_PREFIX)}


def error_reply(
    request: tensor_pb2.TensorHeader | None, error: MCPError, *, retryable: bool = False, flags: int = 0
) -> bytes:
    """The header frame answering ``request`` with ``error`` (the whole reply is this one frame).

    ``retryable``: the request did not start, so it may go to another worker (``FLAG_RETRYABLE``);
    ``flags`` adds other reply flags (``FLAG_DRAINING``)."""
    reply = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REPLY, status_code=int(error.code), flags=flags)
    reply.status_message = error.message
    if request is not None:
        reply.request_id = request.request_id
        reply.model = request.model
        reply.version = request.version
    if retryable:
        reply.flags |= FLAG_RETRYABLE
    return reply.SerializeToString()


def raise_for_status(header: tensor_pb2.TensorHeader) -> None:
    """Raise the reply's error (``errors.CODE_TO_ERROR``) when its status is not OK."""
    if header.status_code != 0:
        raise error_for_code(header.status_code, header.status_message or "worker returned an error")


def local_endpoint(worker_id: str, incarnation: str, endpoint: str, curve_public_key: str = "") -> str:
    """The worker's same-host tensor endpoint: a Linux abstract Unix socket named from everything a link
    to it is (its id, this start's incarnation, its published ``endpoint`` and CURVE key, all in its signed
    record), so a sender derives it from the record alone, a restarted worker has a new one, a record
    naming another endpoint or key names another socket (nobody's), and only a process in the same network
    namespace of the same kernel (the same host, or a container sharing its network) can reach it. No
    file: nothing to clean up."""
    identity = "\0".join((worker_id, incarnation, endpoint, curve_public_key))
    return f"ipc://@mcpmesh-{hashlib.sha256(identity.encode()).hexdigest()[:32]}"
