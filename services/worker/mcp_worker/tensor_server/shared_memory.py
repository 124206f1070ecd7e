"""Tensors a same-host sender passes in its shared memory (``FLAG_SHARED_MEMORY``, ``shm_lease``): mapped
and checked, handed on as views exactly as frames are; the reply region it lends, where the last reply's
outputs go."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import FailedPrecondition, not_started
from mcpcore.transport import shm_lease

__all__ = ["take_shared"]


def take_shared(
    regions: shm_lease.PeerRegions | None,
    identity: Any,
    header: tensor_pb2.TensorHeader,
    frames: Sequence[Any],
    limits: wire.Limits,
) -> tuple[list[Any], shm_lease.ReplyArea | None, int]:
    """The request's tensor frames with those in the sender's shared memory mapped in, its reply region
    and the bytes taken there; ``MCPError`` (not started: ``FailedPrecondition``) for memory that cannot
    be taken (a TCP peer, not the sender's sealed memfd, another pid namespace, a mapping that fails).
    ``regions`` None: this worker has no same-host endpoint."""
    if regions is None:
        raise not_started(
            FailedPrecondition("this worker takes no shared memory (no same-host endpoint); send frames")
        )
    peer = shm_lease.peer_process(identity)
    taken = 0

    def view(region: tensor_pb2.SharedRegion, name: str) -> memoryview:
        nonlocal taken
        taken += region.size
        return regions.view(peer, region, f"tensor {name!r}", writable=False)

    frames = wire.with_regions(header, frames, view, limits)
    area = None
    if header.HasField("reply_region"):
        lent = header.reply_region
        area = shm_lease.ReplyArea(regions.view(peer, lent, "the reply region", writable=True), lent)
        header.ClearField("reply_region")
    return frames, area, taken
