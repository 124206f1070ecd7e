"""The scheduler's client for the workers' ``mcpapi.v2.WorkerControl`` (grpc.aio).

Invariants:
- One channel per worker address, opened on first use and kept (gRPC reconnects it by itself, within a
  second of a restarted worker coming back); ``drop()`` closes one, ``close()`` all.
- Every attempt has a deadline (``timeout_s``, per attempt). Every WorkerControl call is idempotent on
  the worker (loading a loaded version, pausing a paused one, stopping a stopped worker change nothing),
  so each is retried, but only on UNAVAILABLE or DEADLINE_EXCEEDED, at most ``retries`` times, after a
  short jittered backoff. One caveat: the worker answers NotFound to an Unload of a replica it does
  not hold, which is also what a retried Unload sees when its first try got through; callers treat
  NotFound from ``unload`` as "already unloaded".
- No grpc exception leaves this module: a failed call raises the ``MCPError`` of its status
  (``grpc_status.from_rpc_error``), its message prefixed with the worker's address and the method, so a
  person knows which worker said it.
- A call made as a leader carries its fencing token in ``metadata``; a worker that knows of a newer leader
  refuses it ``FAILED_PRECONDITION``, which is not retried.
- A Load request carries a ``ModelSpec`` only with what the caller gave: a part left out (placement,
  batching, priority, QoS) is left unset, so the worker keeps what the model's model.yaml says.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio

from mcpapi.v2 import model_pb2, worker_pb2, worker_pb2_grpc
from mcpcore import errors
from mcpcore.tls import TLSConfig, aio_channel
from mcpcore.transport import grpc_status

__all__ = ["Metadata", "WorkerClients", "load_request"]

#: gRPC metadata sent with a call: a leader's fencing token (``mcpcore.fencing.Fence.metadata``)
Metadata = tuple[tuple[str, str], ...]

log = logging.getLogger(__name__)

_RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    # A restarted worker is reachable again within a second (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


def load_request(
    model: str,
    version: str,
    *,
    memory_bytes: int = 0,
    max_batch_size: int = 0,
    max_queue_delay_us: int | None = None,
    priority: int | None = None,
    latency_sensitivity: float | None = None,
) -> worker_pb2.LoadRequest:
    """The Load request; the spec (and each part of it) only when the caller gave a value for it."""
    spec = model_pb2.ModelSpec()
    if memory_bytes:
        spec.placement.memory_bytes = memory_bytes
    if max_batch_size or max_queue_delay_us is not None:
        spec.batching.max_batch_size = max_batch_size
        if max_queue_delay_us is not None:
            spec.batching.max_queue_delay_us = max_queue_delay_us
    if priority is not None:
        spec.priority = priority
    if latency_sensitivity is not None:
        spec.qos.latency_sensitivity = latency_sensitivity
    request = worker_pb2.LoadRequest(model=model, version=version)
    if spec.ListFields():
        spec.model = model
        spec.versions.append(version)
        request.spec.CopyFrom(spec)
    return request


class WorkerClients:
    """WorkerControl calls to any worker by its gRPC address ("host:port")."""

    def __init__(
        self,
        *,
        timeout_s: float = 30.0,
        retries: int = 2,
        backoff_s: float = 0.1,
        tls: TLSConfig | None = None,
    ) -> None:
        if timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise errors.InvalidArgument(
                f"worker client: timeout_s must be > 0, retries and backoff_s >= 0 "
                f"(got {timeout_s!r}, {retries!r}, {backoff_s!r})"
            )
        self._timeout_s = timeout_s
        self._retries = retries
        self._backoff_s = backoff_s
        self._tls = tls
        self._stubs: dict[str, tuple[grpc.aio.Channel, worker_pb2_grpc.WorkerControlStub]] = {}

    # --- the calls -----------------------------------------------------------------------------------

    async def load(
        self,
        grpc_addr: str,
        model: str,
        version: str,
        *,
        memory_bytes: int = 0,
        max_batch_size: int = 0,
        max_queue_delay_us: int | None = None,
        priority: int | None = None,
        latency_sensitivity: float | None = None,
        timeout_s: float | None = None,
        metadata: Metadata = (),
    ) -> worker_pb2.LoadResponse:
        """Load and warm up; returns once the replica is READY on the worker."""
        request = load_request(
            model,
            version,
            memory_bytes=memory_bytes,
            max_batch_size=max_batch_size,
            max_queue_delay_us=max_queue_delay_us,
            priority=priority,
            latency_sensitivity=latency_sensitivity,
        )
        return await self._call(grpc_addr, "Load", lambda s: s.Load, request, timeout_s, metadata)

    async def unload(
        self,
        grpc_addr: str,
        model: str,
        version: str,
        *,
        timeout_s: float | None = None,
        metadata: Metadata = (),
    ) -> worker_pb2.UnloadResponse:
        request = worker_pb2.UnloadRequest(model=model, version=version)
        return await self._call(grpc_addr, "Unload", lambda s: s.Unload, request, timeout_s, metadata)

    async def pause(
        self,
        grpc_addr: str,
        model: str,
        version: str,
        *,
        timeout_s: float | None = None,
        metadata: Metadata = (),
    ) -> worker_pb2.PauseResponse:
        request = worker_pb2.PauseRequest(model=model, version=version)
        return await self._call(grpc_addr, "Pause", lambda s: s.Pause, request, timeout_s, metadata)

    async def resume(
        self,
        grpc_addr: str,
        model: str,
        version: str,
        *,
        timeout_s: float | None = None,
        metadata: Metadata = (),
    ) -> worker_pb2.ResumeResponse:
        request = worker_pb2.ResumeRequest(model=model, version=version)
        return await self._call(grpc_addr, "Resume", lambda s: s.Resume, request, timeout_s, metadata)

    async def stats(
        self, grpc_addr: str, model: str = "", *, timeout_s: float | None = None
    ) -> worker_pb2.StatsResponse:
        request = worker_pb2.StatsRequest(model=model)
        return await self._call(grpc_addr, "Stats", lambda s: s.Stats, request, timeout_s, ())

    async def emergency_stop(
        self, grpc_addr: str, reason: str, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> worker_pb2.EmergencyStopResponse:
        request = worker_pb2.EmergencyStopRequest(reason=reason)
        return await self._call(
            grpc_addr, "EmergencyStop", lambda s: s.EmergencyStop, request, timeout_s, metadata
        )

    # --- channels ------------------------------------------------------------------------------------

    async def drop(self, grpc_addr: str) -> None:
        """Close the channel to one worker (gone for good); a later call opens a new one."""
        entry = self._stubs.pop(grpc_addr, None)
        if entry is not None:
            await entry[0].close()

    async def close(self) -> None:
        stubs, self._stubs = self._stubs, {}
        await asyncio.gather(*(channel.close() for channel, _ in stubs.values()))

    def _stub(self, grpc_addr: str) -> worker_pb2_grpc.WorkerControlStub:
        entry = self._stubs.get(grpc_addr)
        if entry is None:
            if not grpc_addr or not isinstance(grpc_addr, str):
                raise errors.InvalidArgument(f"worker address {grpc_addr!r} is not a 'host:port'")
            channel = aio_channel(grpc_addr, self._tls, _CHANNEL_OPTIONS)
            entry = self._stubs[grpc_addr] = (channel, worker_pb2_grpc.WorkerControlStub(channel))
        return entry[1]

    # --- retries and errors --------------------------------------------------------------------------

    async def _call(  # noqa: PLR0917  (each call names its method, stub, request, deadline, metadata)
        self,
        grpc_addr: str,
        method: str,
        pick: Callable[[worker_pb2_grpc.WorkerControlStub], Any],
        request: Any,
        timeout_s: float | None,
        metadata: Metadata,
    ) -> Any:
        deadline_s = self._timeout_s if timeout_s is None else timeout_s
        attempt = 0
        while True:
            try:
                stub = pick(self._stub(grpc_addr))
                return await stub(request, timeout=deadline_s, metadata=metadata or None)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code not in _RETRY_CODES or attempt >= self._retries:
                    raise self._error(grpc_addr, method, exc, attempt + 1) from exc
                delay = self._backoff_s * 2**attempt * random.uniform(0.5, 1.0)
                log.info(
                    "worker %s %s: %s (%s); retry %d of %d in %.0f ms",
                    grpc_addr, method, code.name, exc.details(), attempt + 1, self._retries, delay * 1e3,
                )  # fmt: skip
            attempt += 1
            await asyncio.sleep(delay)

    @staticmethod
    def _error(grpc_addr: str, method: str, exc: grpc.aio.AioRpcError, tries: int) -> errors.MCPError:
        base = grpc_status.from_rpc_error(exc)
        after = f" (after {tries} tries)" if tries > 1 else ""
        return errors.error_for_code(base.code, f"worker {grpc_addr} {method}{after}: {base.message}")
