"""The tensor socket's replies: a request's header as received, and the frames that answer it.

Invariant: a reply over the limits is never made (``ResourceExhausted``), so a router never has to drop a
frame it cannot take; a header that does not parse is ``None`` here, answered by the server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import MCPError, ResourceExhausted
from mcpcore.transport import shm_lease

__all__ = ["encode_reply", "header_or_none"]


def header_or_none(frame: Any, limits: wire.Limits) -> tensor_pb2.TensorHeader | None:
    try:
        return wire.parse_header(frame, limits)
    except MCPError:
        return None  # the server parses it again and answers the error


def encode_reply(
    header: tensor_pb2.TensorHeader,
    version: str,
    outputs: dict[str, np.ndarray],
    limits: wire.Limits,
    flags: int = 0,
    *,
    answer: int | None = None,
    area: shm_lease.ReplyArea | None = None,
    on_written: Callable[[int], None] = lambda nbytes: None,
) -> list[Any]:
    """The reply's frames; refuses (``ResourceExhausted``) what a receiver must drop: outputs over the
    frame or message limits. ``area``: the sender's reply region, where the outputs that fit go (their
    bytes go to ``on_written``); ``answer``: a decoupled model's answer number."""
    if len(outputs) > limits.max_tensors:
        raise ResourceExhausted(
            f"model {header.model} made {len(outputs)} outputs, over the limit of {limits.max_tensors}"
        )
    reply = tensor_pb2.TensorHeader(
        kind=tensor_pb2.KIND_REPLY, request_id=header.request_id, model=header.model, version=version,
        flags=flags,
    )  # fmt: skip
    if answer is not None:
        reply.parameters[wire.PARAM_ANSWER] = str(answer)
    frames = wire.encode(reply, outputs, area.place if area is not None else None)
    if area is not None:
        on_written(sum(spec.byte_size for spec in reply.tensors if spec.HasField("shm")))
    total = 0
    for spec in reply.tensors:
        name, size = spec.name, spec.byte_size
        total += size
        if size > limits.max_tensor_bytes:
            raise ResourceExhausted(
                f"output {name} of model {header.model} is {size} bytes, over the "
                f"{limits.max_tensor_bytes}-byte frame limit; send fewer rows per request"
            )
    if total > limits.max_message_bytes:
        raise ResourceExhausted(
            f"the reply of model {header.model} is {total} bytes, over the "
            f"{limits.max_message_bytes}-byte message limit; send fewer rows per request"
        )
    return frames
