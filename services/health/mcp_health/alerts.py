"""Alerts raised by the health service: one structured log line each, optionally POSTed to an Alertmanager.

Invariants:
- Every ``fire`` and ``resolve`` is logged as one JSON line on logger ``mcp_health.alerts`` (WARNING when
  firing, INFO when resolved), deduplicated or not, webhook or not: the log is the record of last resort.
- Webhook delivery never runs on the event loop (``urllib`` in a worker thread), never raises into the
  caller, and never holds more than ``max_queue`` alerts: while the webhook is down the oldest are dropped
  and counted. Failures are logged and reported through ``on_error(kind)``.
- Firing the same alert (same name and labels) again within ``dedupe_s`` is logged but not sent again; a
  resolve is always sent and frees that alert's slot. Alertmanager resolves a firing alert that nobody
  re-sends after its ``resolve_timeout`` (5 m by default): keep ``dedupe_s`` below it and re-fire while the
  condition holds.
- The body is Alertmanager API v2's ``postableAlerts`` (``POST /api/v2/alerts``): a JSON array of
  ``{"labels", "annotations", "startsAt", "endsAt", "generatorURL"}``, times in RFC 3339 (UTC), labels
  ``alertname`` and ``severity`` added to the alert's own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

__all__ = [
    "Alert",
    "Alerter",
    "breaker_open",
    "rfc3339",
    "urllib_post",
    "worker_down",
    "worker_sick",
]

log = logging.getLogger("mcp_health.alerts")

#: ``post(url, body, timeout_s) -> HTTP status``; raises ``OSError`` when nothing answered. Runs in a thread.
Post = Callable[[str, bytes, float], int]

_RESERVED_LABELS = frozenset({"alertname", "severity"})


def rfc3339(unix: float) -> str:
    """``1700000000.5`` -> ``"2023-11-14T22:13:20.500Z"`` (what Alertmanager's ``date-time`` fields take)."""
    return datetime.fromtimestamp(unix, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _frozen_str_map(what: str, value: Mapping[str, str]) -> Mapping[str, str]:
    for k, v in value.items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise ValueError(f"{what}: keys and values must be strings, got {k!r}: {v!r}")
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class Alert:
    """One alert. Times are unix seconds; ``starts_at=None`` means "when fired", ``ends_at=None`` firing."""

    name: str
    severity: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    starts_at: float | None = None
    ends_at: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.severity:
            raise ValueError(f"alert: name and severity are required, got {self.name!r}, {self.severity!r}")
        object.__setattr__(self, "labels", _frozen_str_map("labels", self.labels))
        object.__setattr__(self, "annotations", _frozen_str_map("annotations", self.annotations))
        if _RESERVED_LABELS & self.labels.keys():
            raise ValueError(f"labels: {sorted(_RESERVED_LABELS)} come from name and severity")

    @property
    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """What identifies an alert (for dedupe, and for Alertmanager): its name and labels."""
        return self.name, tuple(sorted(self.labels.items()))

    def __hash__(self) -> int:
        return hash(self.key)

    def to_alertmanager(self, generator_url: str | None = None) -> dict[str, Any]:
        """This alert as one Alertmanager API v2 ``postableAlert``."""
        out: dict[str, Any] = {
            "labels": {"alertname": self.name, "severity": self.severity, **self.labels},
            "annotations": dict(self.annotations),
        }
        if self.starts_at is not None:
            out["startsAt"] = rfc3339(self.starts_at)
        if self.ends_at is not None:
            out["endsAt"] = rfc3339(self.ends_at)
        if generator_url:
            out["generatorURL"] = generator_url
        return out


def urllib_post(url: str, body: bytes, timeout_s: float) -> int:
    """POST a JSON body; the HTTP status, error statuses included. Blocking: call it off the event loop."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"alert webhook {url!r}: only http:// and https:// URLs are sent to")
    request = urllib.request.Request(  # noqa: S310  the scheme is checked above
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310  checked above
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code


class Alerter:
    """Logs alerts and, given ``webhook_url``, sends them to it from one background task.

    ``on_error(kind)`` is called with ``"alert_webhook"`` when a batch could not be delivered after its
    attempts, and ``"alert_queue_full"`` when an alert was dropped (it fits ``count_loop_error``).
    ``sent``, ``failed`` and ``dropped`` count alerts. Call ``close()`` at shutdown.
    """

    def __init__(
        self,
        webhook_url: str = "",
        *,
        generator_url: str | None = None,
        dedupe_s: float = 60.0,
        timeout_s: float = 2.0,
        attempts: int = 3,
        backoff_s: float = 0.2,
        max_queue: int = 256,
        max_batch: int = 64,
        on_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        post: Post = urllib_post,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        if attempts < 1 or max_queue < 1 or max_batch < 1:
            raise ValueError("attempts, max_queue and max_batch must be >= 1")
        self._url = webhook_url
        self._generator_url = generator_url
        self._dedupe_s = dedupe_s
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._on_error = on_error
        self._clock = clock
        self._wall = wall
        self._post = post
        self._sleep = sleep
        #: Firing alerts by key: (starts_at, clock time last sent). Entries leave on resolve.
        self._firing: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, float]] = {}
        self._queue: collections.deque[Alert] = collections.deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.failed = 0
        self.dropped = 0

    async def fire(self, alert: Alert) -> None:
        """Log ``alert`` as firing and send it, unless the same alert was sent less than ``dedupe_s`` ago."""
        now = self._clock()
        previous = self._firing.get(alert.key)
        if alert.starts_at is None:
            starts = previous[0] if previous is not None else self._wall()
            alert = replace(alert, starts_at=starts)
        deduped = previous is not None and now - previous[1] < self._dedupe_s
        if not deduped:
            self._firing[alert.key] = (alert.starts_at, now)
        self._log(logging.WARNING, "firing", alert, deduped=deduped)
        if not deduped:
            self._enqueue(alert)

    async def resolve(self, alert: Alert) -> None:
        """Log ``alert`` as resolved and send it with ``endsAt`` (now, unless it carries its own)."""
        previous = self._firing.pop(alert.key, None)
        if alert.starts_at is None and previous is not None:
            alert = replace(alert, starts_at=previous[0])
        if alert.ends_at is None:
            alert = replace(alert, ends_at=self._wall())
        self._log(logging.INFO, "resolved", alert, deduped=False)
        self._enqueue(alert)

    async def flush(self) -> None:
        """Wait until every queued alert was delivered or given up on."""
        await self._idle.wait()

    async def close(self, flush_timeout_s: float = 5.0) -> None:
        """Deliver what is queued (for at most ``flush_timeout_s``), then stop the sender task."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.flush(), flush_timeout_s)
        except TimeoutError:
            log.warning(_line("alert_close", pending=len(self._queue)))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    def _log(self, level: int, status: str, alert: Alert, *, deduped: bool) -> None:
        fields = {
            "status": status,
            "alertname": alert.name,
            "severity": alert.severity,
            "labels": dict(alert.labels),
            "annotations": dict(alert.annotations),
            "startsAt": rfc3339(alert.starts_at) if alert.starts_at is not None else None,
            "endsAt": rfc3339(alert.ends_at) if alert.ends_at is not None else None,
            "deduped": deduped,
            "webhook": bool(self._url),
        }
        log.log(level, _line("alert", **fields), extra={"alert": fields})

    def _enqueue(self, alert: Alert) -> None:
        if not self._url:
            return
        if len(self._queue) >= self._max_queue:
            oldest = self._queue.popleft()
            self.dropped += 1
            log.error(_line("alert_dropped", alertname=oldest.name, labels=dict(oldest.labels)))
            self._count("alert_queue_full")
        self._queue.append(alert)
        self._idle.clear()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="alert-webhook")

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
            try:
                await self._deliver(batch)
            except Exception:  # a bug here must not end deliveries
                log.exception(_line("alert_sender_error", alerts=len(batch)))
                self.failed += len(batch)
                self._count("alert_webhook")

    async def _deliver(self, batch: list[Alert]) -> None:
        body = json.dumps([a.to_alertmanager(self._generator_url) for a in batch]).encode()
        error = ""
        for attempt in range(self._attempts):
            if attempt:
                await self._sleep(self._backoff_s * 2 ** (attempt - 1))
            try:
                status = await asyncio.to_thread(self._post, self._url, body, self._timeout_s)
            except Exception as exc:  # refused, unreachable, timed out, a garbled answer: all retried
                error = f"{type(exc).__name__}: {exc}"
                continue
            if 200 <= status < 300:
                self.sent += len(batch)
                return
            error = f"HTTP {status}"
            if status < 500 and status != 429:
                break  # the receiver rejects the payload itself: sending it again cannot help
        self.failed += len(batch)
        log.error(
            _line(
                "alert_webhook_failed",
                alerts=[a.name for a in batch],
                attempts=attempt + 1,
                error=error,
                url=self._url,
            )
        )
        self._count("alert_webhook")

    def _count(self, kind: str) -> None:
        if self._on_error is None:
            return
        try:
            self._on_error(kind)
        except Exception:
            log.exception(_line("alert_on_error_failed", kind=kind))


def _line(event: str, **fields: Any) -> str:
    return json.dumps({"event": event, **fields}, sort_keys=True)


# Builders for the health service's alerts: the annotations people read when paged.


def _last_active(last_active: float) -> dict[str, str]:
    return {"last_active": rfc3339(last_active), "last_active_unix": f"{last_active:.3f}"}


def worker_down(
    worker: str, *, replicas: Iterable[str], last_active: float, reason: str, now: float | None = None
) -> Alert:
    """WorkerDown: ``replicas`` are ``model:version`` names; ``last_active`` its last report (unix s)."""
    names = ",".join(sorted(replicas))
    seen = _last_active(last_active)
    return Alert(
        "WorkerDown",
        "critical",
        {"worker": worker},
        {
            "summary": f"Worker {worker} is down: {reason}",
            "description": (
                f"Worker {worker} was last active at {seen['last_active']} (unix {seen['last_active_unix']})."
                f" Its replicas ({names or 'none'}) go to ERROR and are recovered on other workers."
            ),
            "replicas": names,
            **seen,
        },
        starts_at=now,
    )


def worker_sick(
    worker: str,
    *,
    replicas: Iterable[str],
    last_active: float,
    errors: int,
    now: float | None = None,
) -> Alert:
    """WorkerSick: alive but failing; the health service emergency-stops it."""
    names = ",".join(sorted(replicas))
    seen = _last_active(last_active)
    return Alert(
        "WorkerSick",
        "warning",
        {"worker": worker},
        {
            "summary": f"Worker {worker} is sick: {errors} failed requests; emergency stop",
            "description": (
                f"Worker {worker} failed {errors} requests since the last check and was emergency-stopped"
                f" (last active at {seen['last_active']}, unix {seen['last_active_unix']})."
                f" Its replicas ({names or 'none'}) are recovered on other workers."
            ),
            "replicas": names,
            **seen,
        },
        starts_at=now,
    )


def breaker_open(
    model: str, *, level: int, action: str, error_rate: float, now: float | None = None
) -> Alert:
    """BreakerOpen: a model's breaker stepped up to ``level`` (> 0), which applies ``action``."""
    return Alert(
        "BreakerOpen",
        "warning",
        {"model": model},
        {
            "summary": f"Breaker for {model} at level {level} ({action})",
            "description": f"Model {model} has error rate {error_rate:.2f}; breaker level {level}: {action}.",
            "level": str(level),
            "error_rate": f"{error_rate:.4f}",
        },
        starts_at=now,
    )
