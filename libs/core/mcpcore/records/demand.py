"""Process-written counters and presence under a router's or worker's lease (DESIGN.md section 4):
``/mcp/demand/<m>/<router>``, ``/mcp/stats/<source>/<m>``, ``/mcp/routers/<id>``, and the scheduler's
``/mcp/drain/<worker>``.

Invariant: process documents; fields a newer writer adds are ignored and counted (``UNKNOWN_FIELDS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcpcore.records.base import Reader, dumps

__all__ = ["CLASSES", "Demand", "DrainDoc", "RouterRecord", "StatsDoc"]

#: Error classes a stats window counts (``mcpcore.windows``); ``client`` errors never trip a breaker.
CLASSES = ("timeout", "resource", "backend", "unavailable", "client")


def _last(key: str, n: int) -> list[str]:
    return key.split("/")[-n:]


@dataclass(frozen=True)
class Demand:
    """A router's report for one model: requests that found no copy (load on demand) and requests that
    found every copy at its bounded-load cap (a hot model)."""

    model: str
    router: str
    requests: int = 0
    overflow: int = 0
    at: float = 0.0

    @classmethod
    def parse(cls, key: str, raw: bytes | str) -> Demand:
        model, router = _last(key, 2)
        d = Reader(key, raw, ("requests", "overflow", "at"), kind="demand", strict=False)
        return cls(
            model=model,
            router=router,
            requests=d.int_("requests", 0, lo=0),
            overflow=d.int_("overflow", 0, lo=0),
            at=d.float_("at", 0.0),
        )

    def to_json(self) -> bytes:
        return dumps({"requests": self.requests, "overflow": self.overflow, "at": self.at}, sort_keys=True)


@dataclass(frozen=True)
class DrainDoc:
    """A worker being emptied (``/mcp/drain/<worker>``, written by the scheduler's Drain)."""

    reason: str = ""
    at: float = 0.0

    @classmethod
    def parse(cls, key: str, raw: bytes | str) -> DrainDoc:
        d = Reader(key, raw, ("reason", "at"), kind="drain", strict=False)
        return cls(reason=d.str_("reason", "", empty=True), at=d.float_("at", 0.0))

    def to_json(self) -> bytes:
        return dumps({"reason": self.reason, "at": self.at})


@dataclass(frozen=True)
class StatsDoc:
    """One source's window of request counts for one model (``/mcp/stats/<source>/<m>``): what the health
    service's breakers read. ``source`` is the writer's field (``{"router": id}`` or ``{"worker": id}``)."""

    requests: int = 0
    counts: Mapping[str, int] | None = None  # error class -> count, every one of ``CLASSES``
    window_s: float = 0.0
    at: float = 0.0
    source: Mapping[str, str] | None = None

    @classmethod
    def parse(cls, key: str, raw: bytes | str) -> StatsDoc:
        d = Reader(
            key, raw, ("requests", "window_s", "at", "router", "worker", *CLASSES), kind="stats", strict=False
        )
        return cls(
            requests=d.int_("requests", 0, lo=0),
            counts={c: d.int_(c, 0, lo=0) for c in CLASSES},
            window_s=d.float_("window_s", 0.0),
            at=d.float_("at", 0.0),
            source={s: d.str_(s) for s in ("router", "worker") if s in d.body},
        )

    def window(self) -> dict[str, int]:
        """The counts as ``mcp_health.levels.error_rate`` reads them."""
        return {"requests": self.requests, **(self.counts or {})}

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            **(self.source or {}),
            "window_s": self.window_s,
            "at": self.at,
            **self.window(),
        }
        return dumps(body, sort_keys=True)


@dataclass(frozen=True)
class RouterRecord:
    """A router's addresses (``/mcp/routers/<id>``, under its lease): for ``mcpctl dump``."""

    router_id: str = ""
    pid: str = ""
    grpc: str = ""
    rest: str = ""
    metrics: str = ""
    at: float = 0.0

    @classmethod
    def parse(cls, key: str, raw: bytes | str) -> RouterRecord:
        d = Reader(
            key, raw, ("router_id", "pid", "grpc", "rest", "metrics", "at"), kind="router", strict=False
        )
        return cls(
            router_id=d.str_("router_id", _last(key, 1)[0]),
            pid=d.str_("pid", "", empty=True),
            grpc=d.str_("grpc", "", empty=True),
            rest=d.str_("rest", "", empty=True),
            metrics=d.str_("metrics", "", empty=True),
            at=d.float_("at", 0.0),
        )

    def to_json(self) -> bytes:
        body = {
            "router_id": self.router_id,
            "pid": self.pid,
            "grpc": self.grpc,
            "rest": self.rest,
            "metrics": self.metrics,
            "at": self.at,
        }
        return dumps({k: v for k, v in body.items() if v != ""}, sort_keys=True)
