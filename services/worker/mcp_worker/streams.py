"""A decoupled model's answers (several per request): each one its backend emits on an executor thread goes
to the request's ``partial`` callback on the event loop, in order, before the request's last reply; a run
whose request is withdrawn or past its deadline stops at its next answer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import numpy as np

from mcpcore.errors import Aborted, DeadlineExceeded

__all__ = ["answers_on_loop"]


def answers_on_loop(
    partial: Callable[[str, dict[str, np.ndarray]], None],
    version: str,
    key: str,
    timeout_s: float | None,
    stop: threading.Event,
) -> Callable[[dict[str, np.ndarray]], None]:
    """An ``emit`` for the executor thread that hands each answer to ``partial`` on this event loop. The
    loop runs callbacks in the order they were scheduled, so the answers keep their order and all come
    before the request's last reply (whose ``on_done`` comes through the same queue). Past the
    request's deadline, or once the request was withdrawn (``stop``), it raises instead, which ends the
    run: a stream nobody waits for any more does not hold an execution slot."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    sent = 0

    def emit(outputs: dict[str, np.ndarray]) -> None:
        nonlocal sent
        if stop.is_set():
            raise Aborted(f"model {key}: the request was cancelled after {sent} answers")
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlineExceeded(f"model {key} ran past the request's deadline after {sent} answers")
        sent += 1
        loop.call_soon_threadsafe(partial, version, outputs)

    return emit
