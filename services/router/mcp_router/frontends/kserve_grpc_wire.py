"""ModelInfer's bytes without copies of its tensors: a received request's ``raw_input_contents`` become
views into the buffer grpc received, and a response's ``raw_output_contents`` are written once, into the
bytes grpc sends.

Only the top level of a large request is walked (protobuf's wire format: a tag, then a varint, 8 or 4
fixed bytes, or a length and that many bytes); every field but ``raw_input_contents`` (7) goes to
protobuf unchanged and is parsed there, since protobuf copies a bytes field on every parse, read, append
and serialize.

Invariants:
- A request that does not walk cleanly (a truncated field, a group, a varint past 10 bytes) is parsed by
  protobuf whole, which raises as it always did: hostile bytes meet protobuf's checks, never a half-parse.
  So is one with more than ``MAX_FIELDS`` top-level fields: the walk is Python, and a large message of tiny
  fields must not cost the loop more than protobuf's own parse would.
- Requests under ``SPLIT_FROM_BYTES`` are parsed by protobuf whole: for them the copy costs less than the
  walk. Either way the result is an ``InferRequest`` with the entries in order.
- ``serialize_response`` writes ``raw_output_contents`` (6) after the response's other fields; protobuf
  reads fields in any order, and the entries keep theirs. It returns the bytes as ``Parts``: the router's
  native server sends an output of 64 KiB or more from the output's own buffer (no copy in the router);
  a grpc.aio server joins them (``join_parts``, one copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from mcpapi.kserve import grpc_service_pb2 as pb
from mcpcore.serving import Parts

__all__ = ["MAX_FIELDS", "SPLIT_FROM_BYTES", "InferRequest", "parse_request", "serialize_response"]

SPLIT_FROM_BYTES = 64 << 10
MAX_FIELDS = 1024  # a real request has a few per input, output and parameter
_RAW_INPUT_FIELD = 7
_RAW_OUTPUT_TAG = bytes([6 << 3 | 2])  # field 6, length-delimited
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_MAX_TAG_BYTES = 5  # tags and lengths are 32-bit: protobuf refuses a longer (padded) varint for them


class InferRequest(NamedTuple):
    """A received ModelInferRequest: ``message`` holds everything, except that the raw entries are in
    ``raw`` (bytes-like, in order) rather than in ``message.raw_input_contents``."""

    message: pb.ModelInferRequest
    raw: Sequence[Any]

    @classmethod
    def of(cls, message: pb.ModelInferRequest) -> InferRequest:
        return cls(message, message.raw_input_contents)


def parse_request(data: bytes) -> InferRequest:
    """grpc's request deserializer for ModelInfer."""
    if len(data) >= SPLIT_FROM_BYTES:
        split = _split(memoryview(data))
        if split is not None and split[1]:  # with no raw entries, joining the rest would only add a copy
            rest, raw = split
            return InferRequest(pb.ModelInferRequest.FromString(rest), raw)
    return InferRequest.of(pb.ModelInferRequest.FromString(data))


def serialize_response(response: pb.ModelInferResponse, raw: Sequence[Any]) -> Parts:
    """``response`` (its own ``raw_output_contents`` empty) with ``raw`` as its raw entries (bytes, a
    memoryview or a contiguous array each), serialized as parts: the entries are not copied."""
    parts: list[Any] = [response.SerializeToString()]
    for data in raw:
        # read-only: nothing writes an answered output again, and the native server sends only read-only
        # buffers from their own memory (it copies the others)
        view = memoryview(data).cast("B").toreadonly()
        parts += (_RAW_OUTPUT_TAG, _varint_bytes(view.nbytes), view)
    return Parts(parts)


def _split(view: memoryview) -> tuple[bytes, list[memoryview]] | None:
    """(the message without field 7, field 7's entries as views), or None if it does not walk."""
    rest: list[memoryview] = []
    raw: list[memoryview] = []
    pos, end = 0, len(view)
    while pos < end:
        if len(rest) + len(raw) >= MAX_FIELDS:
            return None
        start = pos
        tag, pos = _read_varint(view, pos, _MAX_TAG_BYTES)
        if tag < 0:
            return None
        kind = tag & 7
        if kind == _VARINT:
            _, pos = _read_varint(view, pos)
            if pos < 0:
                return None
        elif kind == _FIXED64:
            pos += 8
        elif kind == _FIXED32:
            pos += 4
        elif kind == _LENGTH:
            size, pos = _read_varint(view, pos, _MAX_TAG_BYTES)
            if size < 0 or pos + size > end:
                return None
            if tag >> 3 == _RAW_INPUT_FIELD:
                raw.append(view[pos : pos + size])
                pos += size
                continue
            pos += size
        else:  # groups (deprecated) and invalid kinds: protobuf decides
            return None
        if pos > end:
            return None
        rest.append(view[start:pos])
    return b"".join(rest), raw


def _read_varint(view: memoryview, pos: int, max_bytes: int = 10) -> tuple[int, int]:
    """(value, next position), or (-1, -1) when it runs past the end or past ``max_bytes`` bytes."""
    value = shift = 0
    end = min(len(view), pos + max_bytes)
    while pos < end:
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return -1, -1


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
