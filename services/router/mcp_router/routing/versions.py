"""The version a request goes to, and what its model's breaker level asks of it (DESIGN.md 7).

In order: a version named by the request must be one the model declares (else ``NotFound``); at breaker
level 3, the model's fallback version when it has replicas; else the split in force
(``split.choose_version``): the canary sticky by routing key, interleaved by smooth weighted round robin
without one, and dropped at any breaker level above 0. A model with no split yet is ``Unavailable`` "not
started" (retryable), reported to ``on_demand`` when it loads on demand. From level 2 the request carries
the flag that turns the model's secondary features off.

Pure: no I/O. One ``VersionChoice`` per router, used from its event loop (its round robins hold state).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mcp_router.routing.split import SmoothWeightedRoundRobin, choose_version
from mcpapi.v2 import tensor_pb2
from mcpcore.errors import NotFound, Unavailable, not_started

if TYPE_CHECKING:
    from mcp_router.routing.table import ModelRoute

__all__ = ["FLAG_SECONDARY_OFF", "Choice", "VersionChoice", "unknown_version"]

FLAG_SECONDARY_OFF = tensor_pb2.FLAG_SECONDARY_FEATURES_OFF


#: (the version, the model's breaker level now, the TensorHeader flags the request carries); a plain tuple,
#: made once per request.
Choice = tuple[str, int, int]


def unknown_version(route: ModelRoute, version: str) -> NotFound:
    declared = sorted(route.declared | set(route.rings), key=int)
    return NotFound(f"model {route.name} has no version {version}; it declares {declared}")


class VersionChoice:
    def __init__(self, *, on_demand: Callable[[str], None] = lambda model: None) -> None:
        self._on_demand = on_demand
        self._rr: dict[str, SmoothWeightedRoundRobin] = {}  # per model, for its split in force

    def choose(self, route: ModelRoute, version: str, key: str, now: float) -> Choice:
        """The version for a request naming ``version`` ("" = none) with routing key ``key``."""
        level = route.breaker_level(now)
        flags = FLAG_SECONDARY_OFF if level >= 2 else 0
        if version:
            if not route.knows(version):
                raise unknown_version(route, version)
            return version, level, flags
        if level >= 3 and route.fallback_version and route.fallback_version in route.rings:
            return route.fallback_version, level, flags
        split = route.routing
        if split is None:
            if route.load_on_demand:
                self._on_demand(route.name)
                raise not_started(
                    Unavailable(f"model {route.name} is being loaded on demand; retry in a second")
                )
            raise not_started(Unavailable(f"model {route.name} has no version in service yet; retry shortly"))
        canary = split.canary if level == 0 else None  # any breaker level drops the canary
        rr = None
        if canary and 0 < split.canary_percent < 100 and not key:
            rr = self._rr.get(route.name)
            weights = {split.stable: 100 - split.canary_percent, canary: split.canary_percent}
            if rr is None or rr.weights != weights:
                rr = self._rr[route.name] = SmoothWeightedRoundRobin.for_canary(
                    split.stable, canary, split.canary_percent
                )
        return choose_version(split.stable, canary, split.canary_percent, key, rr), level, flags
