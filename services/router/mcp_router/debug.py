"""The router's ``/debug/snapshot`` document: its routing table and its links, as JSON (``mcpctl dump``).

Invariants:
- ``snapshot_doc`` runs on a thread of the metrics HTTP server, not on the router's event loop. It reads
  only the table it is given (immutable: the watch loop replaces it whole) and the forwarder's counters
  through a copy (``dict(...)`` is one C-level step under the GIL; iterating the live dict while the loop
  adds a worker would raise). It never mutates anything and never blocks the loop.
- The document is plain JSON (strings, numbers, bools, lists, objects); versions and workers are sorted, so
  two dumps of the same table are equal.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from mcp_router.routing.table import ModelRoute, RoutingTable, WorkerEndpoint

if TYPE_CHECKING:
    from mcpcore.transport.forwarder import Forwarder

__all__ = ["snapshot_doc"]


def snapshot_doc(table: RoutingTable, forwarder: Forwarder, router_id: str) -> dict[str, Any]:
    """The routing table ``table`` with each worker's in-flight count and link state from ``forwarder``."""
    now = time.time()
    loads = dict(forwarder.loads)
    workers = dict(table.workers)
    return {
        "router_id": router_id,
        "pid": os.getpid(),
        "at": now,
        "revision": table.revision,
        "features_off": list(table.features_off),
        "models": {name: _model(route, now) for name, route in sorted(dict(table.models).items())},
        "workers": {
            worker_id: _worker(
                endpoint, loads.get(worker_id, 0), forwarder.link_ok(worker_id), forwarder.address(worker_id)
            )
            for worker_id, endpoint in sorted(workers.items())
        },
    }


def _model(route: ModelRoute, now: float) -> dict[str, Any]:
    split = route.routing
    breaker = route.breaker
    return {
        "routing": None
        if split is None
        else {"stable": split.stable, "canary": split.canary, "canary_percent": split.canary_percent},
        "versions": {
            version: {"nodes": dict(sorted(ring.nodes.items()))}
            for version, ring in sorted(dict(route.rings).items(), key=lambda item: _version_key(item[0]))
        },
        "breaker": {
            "level": breaker.level,
            "level_now": route.breaker_level(now),
            "reason": breaker.reason,
            "set_by": breaker.set_by,
            "since": breaker.since,
            "until": breaker.until,
        },
        "fallback_version": route.fallback_version,
        "default_version": route.default_version(),
        "load_on_demand": route.load_on_demand,
        "declared": sorted(route.declared, key=_version_key),
        "idempotent": dict(sorted(dict(route.idempotent).items())),
        "max_ongoing": dict(sorted(dict(route.max_ongoing).items())),
        "secondary": {v: sorted(names) for v, names in sorted(dict(route.secondary).items())},
    }


def _worker(endpoint: WorkerEndpoint, in_flight: int, link_ok: bool, address: str) -> dict[str, Any]:
    return {
        "zmq": endpoint.zmq,
        "grpc": endpoint.grpc,
        "curve_public_key": endpoint.curve_public_key,
        "incarnation": endpoint.incarnation,
        "capacity": endpoint.capacity,
        "draining": endpoint.draining,
        "zmq_features": sorted(endpoint.zmq_features),
        "in_flight": in_flight,
        "link_ok": link_ok,
        "link_address": address,  # where the link connects: the same-host endpoint, or "zmq"
    }


def _version_key(version: str) -> tuple[int, str]:
    """Versions in numeric order ("10" after "9"); anything else after them, by name."""
    return (int(version), "") if version.isdigit() else (1 << 62, version)
