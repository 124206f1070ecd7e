"""A queued request (``Pending``) and how it is answered: exactly once, through the ``OnDone`` callback
it was queued with, on the event loop; a withdrawn request's answer goes nowhere."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcp_worker.batching.policy import Request

__all__ = ["OnDone", "Pending", "RunBatch", "Tensors", "answer"]

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]
#: Runs one batch: blocking and thread-safe; inputs are concatenated along axis 0 when batching. Called
#: with keyword arguments only where a batch has them: ``skip``, ``parameters``, ``emit`` (see
#: ``Backend.infer``).
RunBatch = Callable[..., Tensors]
#: Takes a request's outputs, or the error that ends it; called once, on the event loop.
OnDone = Callable[[Tensors | BaseException], None]


@dataclass(eq=False, slots=True, kw_only=True)
class Pending(Request):
    """A queued request with what the dispatcher needs to run and answer it."""

    request_id: str
    inputs: Tensors | None
    on_done: OnDone | None  # None once answered or withdrawn
    timeout_s: float | None
    skip: frozenset[str] = frozenset()
    parameters: Mapping[str, str] | None = None
    emit: Callable[[Tensors], None] | None = None
    parent: Any = None  # the sampled trace context it came under (a SpanContext), when traced
    queued_ns: int = 0  # wall clock, when traced


def answer(req: Pending, result: Tensors | BaseException) -> None:
    """Hand ``req`` its result, once: later calls, and a withdrawn request's, go nowhere."""
    on_done, req.on_done = req.on_done, None
    req.inputs = None  # the heap may hold the request a while: not its tensors
    if on_done is None:  # a withdrawn request's answer goes nowhere
        return
    try:
        on_done(result)
    except Exception:  # its own taker's fault: the rest of its batch is still answered
        log.exception("request %s: its answer could not be taken", req.request_id)
