"""Executions: every request a worker runs is counted, and one run twice is caught (DESIGN.md 7, delivery).

``Executions.record(model, request_ids)`` is called as a batch starts. It counts each request in
``mcp_worker_executions_total{model}``; a request id seen within the last ``window`` ids is a duplicate
execution: counted in ``mcp_worker_duplicate_executions_total{model}`` and logged with the id. Ids are
the sender's correlation ids (a router's are unique per router process, and a retry keeps its id), so
"at most once" on one worker is a counter a test reads.

With ``journal`` set, every execution is also appended to that file as a line ``<model> <request id>``,
written as the batch starts (one ``write`` per batch, to the page cache: it survives ``kill -9`` of the
worker), so a test or benchmark can count requests run on two workers after one was killed. Off by
default: production workers keep no per-request files.

Invariants: memory is bounded by ``window``; ``record`` never raises into the dispatcher (a failing
journal write is logged once and the journal is closed).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence

__all__ = ["Executions"]

log = logging.getLogger(__name__)


class Executions:
    def __init__(
        self,
        *,
        window: int = 65536,
        journal: str = "",
        on_execution: Callable[[str, int], None] = lambda model, n: None,
        on_duplicate: Callable[[str], None] = lambda model: None,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self._window = window
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._on_execution, self._on_duplicate = on_execution, on_duplicate
        self._fd = -1
        if journal:
            self._fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.total = 0
        self.duplicates = 0

    def record(self, model: str, request_ids: Sequence[str]) -> None:
        seen = self._seen
        for rid in request_ids:
            if rid in seen:
                self.duplicates += 1
                self._on_duplicate(model)
                log.warning("request %s of model %s is executed again on this worker", rid, model)
                seen.move_to_end(rid)
            else:
                seen[rid] = None
                if len(seen) > self._window:
                    seen.popitem(last=False)
        self.total += len(request_ids)
        self._on_execution(model, len(request_ids))
        if self._fd >= 0:
            self._write("".join(f"{model} {rid}\n" for rid in request_ids).encode())

    def _write(self, data: bytes) -> None:
        try:
            os.write(self._fd, data)
        except OSError as exc:
            log.error("execution journal: write failed (%s); journal closed", exc)
            self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
