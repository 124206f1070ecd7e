"""The worker's ZeroMQ tensor server: a ROUTER socket speaking ``mcpcore.wire``.

Invariants:
- Many requests are in flight at once: each message becomes its own task, and replies go out in whatever
  order the work finishes, addressed by the peer identity and carrying the request id.
- Nothing a peer sends can stop the server: a malformed message is answered with an error reply (its
  gRPC code in the header) and the loop goes on. A tensor frame over ``max_tensor_bytes`` is answered
  RESOURCE_EXHAUSTED; a single frame over ``max_message_bytes`` is refused by ZeroMQ itself
  (``MAXMSGSIZE``, per frame) before it is buffered, which disconnects that peer instead of answering.
- Tensors are received and sent without copies (``copy=False``; ``np.frombuffer`` views).
- With a CURVE secret key configured, only peers that know the server's public key can connect.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq
import zmq.asyncio

from mcp_worker.buffers import BatchBuffers, Lease
from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import Internal, InvalidArgument, MCPError

__all__ = ["Handler", "TensorServer", "load_curve_secret"]


def _header_or_none(frame: Any, limits: wire.Limits) -> tensor_pb2.TensorHeader | None:
    try:
        return wire.parse_header(frame, limits)
    except MCPError:
        return None  # _reply parses it again and answers the error


def _spec(header: tensor_pb2.TensorHeader | None, index: int) -> tensor_pb2.TensorSpec | None:
    if header is None or not 0 <= index < len(header.tensors):
        return None
    return header.tensors[index]


log = logging.getLogger(__name__)

#: Gets the decoded request; returns the version that served it and the output tensors (or raises an
#: MCPError, which goes back in the reply header).
Handler = Callable[[wire.Message], Awaitable[tuple[str, dict[str, np.ndarray]]]]


def load_curve_secret(path: str) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys from a file written by ``zmq.auth.create_certificates``."""
    import zmq.auth  # noqa: PLC0415  (only workers configured for CURVE need it)

    public, secret = zmq.auth.load_certificate(Path(path))
    if secret is None:
        raise ValueError(f"{path} holds no secret key")
    return public, secret


class TensorServer:
    def __init__(
        self,
        bind: str,
        handler: Handler,
        *,
        limits: wire.Limits = wire.DEFAULT_LIMITS,
        curve_secret: bytes | None = None,
        on_error: Callable[[str], None] | None = None,
        buffers: BatchBuffers | None = None,
    ) -> None:
        self._bind = bind
        self._handler = handler
        self._limits = limits
        self._curve_secret = curve_secret
        self._on_error = on_error or (lambda where: None)
        self._buffers = buffers
        self._ctx = zmq.asyncio.Context()
        self._sock: zmq.asyncio.Socket | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.endpoint = ""

    async def start(self) -> str:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a gone peer's reply is dropped, not an error
        sock.setsockopt(zmq.MAXMSGSIZE, self._limits.max_message_bytes + self._limits.max_header_bytes)
        if self._curve_secret is not None:
            sock.setsockopt(zmq.CURVE_SERVER, 1)
            sock.setsockopt(zmq.CURVE_SECRETKEY, self._curve_secret)
        sock.bind(self._bind)
        self._sock = sock
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._loop_task = asyncio.create_task(self._serve(), name="zmq-serve")
        return self.endpoint

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(linger=0)
        self._ctx.term()

    async def _serve(self) -> None:
        assert self._sock is not None
        while True:
            leases: list[Lease] = []
            try:
                frames = await self._receive(leases)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("receive failed; the server goes on")
                self._on_error("zmq_receive")
                continue
            task = asyncio.create_task(self._answer(frames[0], frames[1:], leases))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _receive(self, leases: list[Lease]) -> list[Any]:
        """One multipart message. Large tensor frames are received straight into pool blocks (sized by the
        header, bounded by the limits first); everything else zero-copy as libzmq holds it."""
        sock = self._sock
        assert sock is not None
        frames: list[Any] = [await sock.recv(copy=False)]
        more = frames[0].more
        header = None
        while more:
            spec = _spec(header, len(frames) - 2)
            size = spec.byte_size if spec is not None else 0
            if (
                self._buffers is not None
                and self._buffers.wants(size)
                and size <= self._limits.max_tensor_bytes
            ):
                lease = self._buffers.take(size + 1)  # type: ignore[union-attr]  # +1: a longer frame shows
                leases.append(lease)
                got = await sock.recv_into(lease.buffer)
                frames.append(lease.buffer[: min(got, size + 1)])
                more = bool(sock.getsockopt(zmq.RCVMORE))
            else:
                frame = await sock.recv(copy=False)
                frames.append(frame)
                more = frame.more
            if len(frames) == 2:  # the header: parsed here only to size the tensor frames that follow
                header = _header_or_none(frames[1], self._limits)
        return frames

    async def _answer(self, identity: zmq.Frame, frames: list[Any], leases: list[Lease]) -> None:
        try:
            await self._reply(identity, frames)
        finally:
            for lease in leases:  # the request is answered: its receive buffers go back to the pool
                lease.release()

    async def _reply(self, identity: zmq.Frame, frames: list[Any]) -> None:
        assert self._sock is not None
        header: tensor_pb2.TensorHeader | None = None
        try:
            if not frames:
                raise InvalidArgument("empty message: expected [TensorHeader, tensor frames...]")
            header = wire.parse_header(frames[0], self._limits)
            msg = wire.Message(header, wire.tensors_of(header, frames[1:], self._limits))
            version, outputs = await self._handler(msg)
            reply = tensor_pb2.TensorHeader(
                kind=tensor_pb2.KIND_REPLY, request_id=header.request_id, model=header.model, version=version
            )
            out = wire.encode(reply, outputs)
        except MCPError as err:
            out = [wire.error_reply(header, err, retryable=err.retryable)]
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("request %s failed", header.request_id if header else "?")
            self._on_error("zmq_request")
            out = [wire.error_reply(header, Internal("internal error; the worker log has the details"))]
        try:
            await self._sock.send_multipart([identity, *out], copy=False)
        except zmq.ZMQError as exc:
            log.warning("could not send a reply: %s", exc)
