"""Delivery: one request sent to workers until it is answered, as DESIGN.md 7 allows (at most once).

What a failure allows:
- not sent (link down, draining or full) or answered "not started" by the worker: the next distinct ring
  node may take it, whatever the model; a "draining" answer also stops choosing that worker;
- the worker's link failed while it held the request ("may have started"): an idempotent model is sent
  once more elsewhere, any other model fails UNAVAILABLE "may have started" (never run twice);
- anything else the worker answered is the answer.

Invariants:
- A placed sequence (``routing.sequences``) goes only to its pinned worker: when that worker is gone,
  draining or failed with the request in flight, the request fails ``ABORTED`` and the sequence is lost,
  never re-routed. An unplaced one is pinned where its first answer came from.
- A decoupled model's answers before its last go to ``on_partial``; once one went out, the request is
  never sent again.
- Retries after a start was possible, and after an overload refusal, draw from a budget (a fraction of
  recent requests), so they cannot amplify an outage; every retry is counted by reason. Nothing here
  awaits etcd.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mcp_router.dataplane import InferResult, SequenceFlags
from mcp_router.routing.pick import Full, no_worker, pick_worker
from mcp_router.routing.sequences import Pin, Sequences
from mcp_router.routing.table import ModelRoute
from mcp_router.snapshot import Snapshots
from mcp_router.stats import RequestStats
from mcp_router.trace import Trace
from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import DeadlineExceeded, MCPError, Unavailable, error_for_code, not_started
from mcpcore.retry import RetryBudget
from mcpcore.transport.forwarder import Forwarder, MayHaveStarted, NotSent

__all__ = ["Delivery", "Outgoing"]


@dataclass(slots=True)
class Outgoing:
    """What every try of one request sends, and where a sequence or a stream wants it."""

    model: str
    version: str
    key: str  # the ring key: the routing key, the sequence's id, or the request's own id
    rid: str  # this router's id on the wire
    inputs: Mapping[str, np.ndarray]
    priority: int
    flags: int
    features: tuple[str, ...]  # breaker level 2's features off
    nbytes: int
    parameters: Mapping[str, str]
    sequence: SequenceFlags | None
    pin: Pin | None
    on_partial: Callable[[InferResult], None] | None
    trace: Trace | None
    log: dict[str, str]  # its bound log fields: the worker tried goes in
    span: Any = None  # its OpenTelemetry span, when traced
    traceparent: str = ""  # the span's, for the worker

    def header(self, left_s: float) -> tensor_pb2.TensorHeader:
        header = tensor_pb2.TensorHeader(
            kind=tensor_pb2.KIND_REQUEST, request_id=self.rid, model=self.model, version=self.version,
            timeout_us=max(1, int(left_s * 1e6)), priority=self.priority, flags=self.flags,
        )  # fmt: skip
        header.parameters.update(self.parameters)
        if self.features:
            header.parameters[wire.PARAM_FEATURES_OFF] = ",".join(self.features)
        if self.traceparent:
            header.parameters[wire.PARAM_TRACEPARENT] = self.traceparent
        return header


@dataclass(slots=True)
class _Attempts:
    """One request's tries: the workers tried, its one resend after "may have started", the last error."""

    deadline: float
    tried: set[str] = field(default_factory=set)
    resent: bool = False
    maybe_ran: bool = False  # a worker held it when its link failed: "not started" can no longer be said
    last: MCPError | None = None
    again: str = ""  # why the next send is a retry (mcp_router_retries_total{reason})
    streamed: bool = False  # a decoupled model's answer went out: never send it again

    def failed(self, worker: str, error: MCPError, again: str) -> None:
        self.tried.add(worker)
        self.last, self.again = error.with_traceback(None), again  # kept: no frames (they hold this)

    def final(self, fallback: MCPError) -> MCPError:
        """The error to answer with once nothing is left to try: the last worker's answer, never marked
        "not started" if an earlier try may have run."""
        error = self.last or fallback
        if self.maybe_ran:
            error.not_started = False
        return error


class Delivery:
    def __init__(
        self,
        snapshots: Snapshots,
        forwarder: Forwarder,
        stats: RequestStats,
        sequences: Sequences,
        *,
        load_factor: float,
        retry_budget: RetryBudget,
    ) -> None:
        self._snap = snapshots
        self._fwd = forwarder
        self._stats = stats
        self._sequences = sequences
        self._c = load_factor
        self._budget = retry_budget

    def pick(self, route: ModelRoute, version: str, key: str, tried: set[str]) -> str:
        """The worker for ``key`` on ``version``'s ring (``routing.pick``), over the forwarder's live
        in-flight counts of that (model, version); an overflow is counted."""
        ring = route.rings.get(version)
        if not ring:
            raise not_started(
                Unavailable(f"model {route.name} version {version} has no RUNNING replica; retry shortly")
            )
        try:
            return pick_worker(
                ring, key, self._fwd.ring_load(route.name, version), self._fwd, c=self._c,
                limit=route.max_ongoing.get(version, 0), tried=tried, model=route.name, version=version,
            )  # fmt: skip
        except Full:
            self._stats.overflow(route.name)
            raise

    async def send(self, route: ModelRoute, req: Outgoing, deadline: float) -> InferResult:
        """Send until answered, as the delivery rules allow (the module's docstring)."""
        attempts = _Attempts(deadline)
        model, chosen, pin, trace = route.name, req.version, req.pin, req.trace
        while True:
            route = self._snap.table.models.get(model, route)
            try:
                if pin is not None:  # a placed sequence goes nowhere else
                    if pin.worker in attempts.tried:
                        raise attempts.final(no_worker(model, chosen))
                    worker = pin.worker
                else:
                    worker = self.pick(route, chosen, req.key, attempts.tried)
            except Unavailable as err:  # none left: the last worker's answer says the most
                raise attempts.final(err) from None
            left = attempts.deadline - time.monotonic()
            if left <= 0:
                raise attempts.final(DeadlineExceeded(f"request to {model}/{chosen} ran out of time"))
            if attempts.again:
                self._stats.retried(attempts.again)
            req.log["worker"] = worker
            if req.span is not None or trace is not None:
                _sending(req, worker, attempts.again)
            partial = None
            if req.on_partial is not None:
                partial = _partial(model, chosen, worker, attempts, req.on_partial)
            try:
                reply = await self._fwd.send(
                    worker,
                    req.header(left),
                    req.inputs,
                    timeout_s=left,
                    nbytes=req.nbytes,
                    on_partial=partial,
                )
            except NotSent as err:  # never left this router: another worker may take it, no budget
                attempts.failed(worker, not_started(err), "not_sent")
                continue
            except MayHaveStarted as err:
                self._may_have_started(route, req, worker, attempts, err)
                continue
            if trace is not None:
                trace.mark("FORWARD_END")
            if req.sequence is not None and pin is None:  # placed where its first answer came from
                endpoint = self._snap.table.workers.get(worker)
                incarnation = endpoint.incarnation if endpoint is not None else ""
                self._sequences.place(model, req.sequence, chosen, worker, incarnation)
            if not reply.header.status_code:
                return InferResult(model, reply.header.version or chosen, worker, reply.named())
            if pin is not None and req.sequence is not None:
                if reply.header.flags & wire.FLAG_DRAINING:
                    raise self._sequences.lose(model, req.sequence, worker, "is draining")
                wire.raise_for_status(reply.header)  # not started there, or failed: never another worker
            self._refused(worker, reply.header, attempts)

    def _may_have_started(
        self, route: ModelRoute, req: Outgoing, worker: str, attempts: _Attempts, err: MayHaveStarted
    ) -> None:
        """The worker's link failed while it held the request: return to send it once more, or raise."""
        model = route.name
        if req.sequence is not None:
            raise self._sequences.lose(
                model, req.sequence, worker, "failed while the request was in flight"
            ) from None
        if not _resend(route, req.version, worker, attempts):
            self._stats.may_have_started(model)
            raise Unavailable(
                f"{err.message}; it may have started, so it was not sent again (model {model} is not "
                "idempotent, or its one resend or the retry budget is spent): retry only if running it "
                "twice is safe"
            ) from None

    def _refused(self, worker: str, header: tensor_pb2.TensorHeader, attempts: _Attempts) -> None:
        """A worker's error reply: raise it, unless it says "not started" and another worker may try."""
        if not header.flags & wire.FLAG_RETRYABLE:
            wire.raise_for_status(header)
        error = not_started(error_for_code(header.status_code, header.status_message or "worker error"))
        if header.flags & wire.FLAG_DRAINING:  # leaving: choose it no more; resending costs it nothing
            self._fwd.mark_draining(worker)
            attempts.failed(worker, error, "draining")
            return
        if not (time.monotonic() < attempts.deadline and self._budget.spend()):
            attempts.last = error
            raise attempts.final(error)
        attempts.failed(worker, error, "not_started")


def _sending(req: Outgoing, worker: str, again: str) -> None:
    """The request's span and Triton trace learn the worker it goes to now (and why again)."""
    if req.span is not None:
        req.span.set_attribute("mcp.worker", worker)
        if again:
            req.span.add_event("retry", {"reason": again, "mcp.worker": worker})
    if req.trace is not None:
        req.trace.attribute("worker", worker)
        req.trace.mark("FORWARD_START")


def _partial(
    model: str, version: str, worker: str, attempts: _Attempts, on_partial: Callable[[InferResult], None]
) -> Callable[[wire.Message], None]:
    def partial(msg: wire.Message) -> None:
        attempts.streamed = True
        on_partial(InferResult(model, msg.header.version or version, worker, msg.named()))

    return partial


def _resend(route: ModelRoute, version: str, worker: str, attempts: _Attempts) -> bool:
    """After "may have started": whether the request goes out once more (idempotent models only).

    Not drawn from the retry budget: once per request bounds it (a worker that dies holding 100 requests
    costs 100 resends, never more), and an idempotent model must lose nothing to a kill."""
    attempts.tried.add(worker)
    attempts.maybe_ran = True
    if (
        attempts.resent
        or attempts.streamed
        or not route.idempotent.get(version, False)
        or time.monotonic() >= attempts.deadline
    ):
        return False
    attempts.resent, attempts.again = True, "may_have_started"
    return True
