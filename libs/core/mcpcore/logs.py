"""Log lines of every service process: one JSON object per line on stderr (the default), or text.

A JSON line holds ``ts`` (RFC 3339, UTC, milliseconds: ``2025-01-31T12:00:00.123Z``), ``level``,
``logger``, ``msg``; the process's own fields (``service``; a worker adds ``worker``, its id); where a
request is being handled, its fields:

- ``request_id``: the mesh's id of the request on the wire, the router's correlation id, which the
  worker logs too (one id joins a router's lines to a worker's); on a worker's batch lines, the ids of
  the batch's requests, comma separated;
- ``client_request_id``: the id the client gave the router (router lines only);
- ``trace_id``: the W3C trace id, when the request is traced (``mcpcore.tracing``);
- ``model``; and on a router ``worker``, the worker the request was sent to;

any ``extra=`` field of the call itself; and ``exc`` (the traceback text) when there is an exception.
The text format is the one for people at a terminal: ``<time> <LEVEL> <logger>: <message>``.

Request fields travel in a context variable (``bind`` .. ``reset``): set where a request is handled,
they reach every line logged from that code, from tasks it starts, and from executor threads that run in
a copy of its context (``contextvars.copy_context``). A bind replaces the fields bound before (one
request's fields never mix with another's); its dict may be filled in as more of the request is known.
A call's ``extra=`` wins over bound fields, which win over the process's.

Invariants:
- One line per record, whatever the message holds (JSON escapes newlines); a value JSON cannot encode
  is written as its ``str``; empty fields are left out.
- Per request, a bind costs one context variable set; fields are read and encoded only when a line is
  written.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

__all__ = ["FORMATS", "TEXT_FORMAT", "JsonFormatter", "OncePer", "bind", "bound", "reset", "setup"]

FORMATS = ("json", "text")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_FIELDS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "mcp_log_fields", default=None
)
# what every LogRecord has: anything else on a record came as extra=
_RECORD_KEYS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


def bind(**fields: str) -> tuple[dict[str, str], contextvars.Token[dict[str, str] | None]]:
    """Make ``fields`` the request fields of this context until ``reset(token)``; returns (the dict, so
    that the caller may add fields as it learns them, and the token)."""
    return fields, _FIELDS.set(fields)


def reset(token: contextvars.Token[dict[str, str] | None]) -> None:
    """Restore the fields bound before ``bind`` gave ``token``."""
    _FIELDS.reset(token)


def bound() -> Mapping[str, str]:
    """The request fields of this context (empty outside a request)."""
    return _FIELDS.get() or {}


def _timestamp(created: float, msecs: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; ``static``: the process's own fields, on every line."""

    def __init__(self, static: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._static = {k: v for k, v in (static or {}).items() if v}

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _timestamp(record.created, record.msecs),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **self._static,
        }
        fields = _FIELDS.get()
        if fields:
            doc.update((k, v) for k, v in fields.items() if v)
        for key, value in record.__dict__.items():
            if key not in _RECORD_KEYS and value is not None:
                doc[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str)


def setup(
    log_format: str = "json",
    *,
    level: str | int = "INFO",
    static: Mapping[str, str] | None = None,
    stream: IO[str] | None = None,
) -> None:
    """The root logger writes ``log_format`` lines (``FORMATS``) to ``stream`` (stderr) from ``level`` up,
    replacing the handlers it had. ``ValueError`` for an unknown format or level."""
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(static) if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.setLevel(level.upper() if isinstance(level, str) else level)  # ValueError before anything moves
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)


class OncePer:
    """Say yes to a cause at most once per ``interval_s`` (and count the times in between), so that a
    flood of one bad input costs one log line a period: ``if (n := limiter.allow(cause)) is not None:
    log.warning(..., n)`` where ``n`` is how many were left unsaid since the last line."""

    def __init__(self, interval_s: float = 10.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval_s
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}  # cause -> (when last said, times unsaid since)

    def allow(self, cause: str) -> int | None:
        now = self._clock()
        last = self._last.get(cause)
        if last is not None and now - last[0] < self._interval:
            self._last[cause] = (last[0], last[1] + 1)
            return None
        if len(self._last) >= 1024:  # causes are few; a flood of distinct ones is bounded all the same
            self._last.clear()
        self._last[cause] = (now, 0)
        return last[1] if last is not None else 0
