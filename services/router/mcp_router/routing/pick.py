"""The worker a request goes to on its version's ring: the router's one pick (DESIGN.md 7).

Consistent hashing with bounded loads (``HashRing.lookup_bounded``) over the workers that may take the
request now: a usable link (connected, not draining) and fewer than the version's
``max_ongoing_requests`` in flight. When no worker under its bounded-load cap may take it (the caps
assume every node usable), the least loaded one that may; as a last resort a worker handing its replicas
over (its link still serving). A worker in ``tried`` is never chosen.

Pure: the links and the loads are read through the arguments (the forwarder's, in the router). A pick
reads O(1) in the common case: the key's owner is under its cap and usable.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Protocol

from mcp_router.routing.ring import HashRing
from mcpcore.errors import Unavailable, not_started

__all__ = ["Full", "Links", "Loads", "no_worker", "pick_worker"]


class Links(Protocol):
    def usable(self, worker: str) -> bool:
        """Connected and not draining: a new request may go there."""

    def serving(self, worker: str) -> bool:
        """Connected and still taking requests, though it may be handing its replicas over."""


class Loads(Protocol):
    """One ring's requests in flight: per worker, and their sum."""

    @property
    def per_worker(self) -> Mapping[str, int]: ...

    @property
    def total(self) -> int: ...


class Full(Unavailable):
    """Every worker that could take the request has ``max_ongoing_requests`` in flight (Triton's words)."""


def no_worker(model: str, version: str) -> Unavailable:
    return not_started(Unavailable(f"no worker of model {model} version {version} could take the request"))


def pick_worker(
    ring: HashRing,
    key: str,
    load: Loads,
    links: Links,
    *,
    c: float,
    limit: int = 0,
    tried: Set[str] = frozenset(),
    model: str,
    version: str,
) -> str:
    """The worker for ``key``: ``c`` is the bounded-load factor, ``limit`` the version's
    ``max_ongoing_requests`` (0: none). Raises ``Full`` (not started) when every worker that may take it
    is at ``limit``, ``Unavailable`` (not started) when none may."""
    counts = load.per_worker
    usable = links.usable  # no limit: the link's own check, with no wrapper to call through
    if limit:

        def usable(node: str) -> bool:
            return links.usable(node) and counts.get(node, 0) < limit

    node = ring.lookup_bounded(key, counts, c, total=load.total, exclude=tried, usable=usable)
    if node is not None:
        return node
    able = [n for n in ring.nodes if n not in tried and links.usable(n)]
    room = [n for n in able if not (limit and counts.get(n, 0) >= limit)]
    if not room:
        room = [n for n in ring.nodes if n not in tried and links.serving(n)]
        room = [n for n in room if not (limit and counts.get(n, 0) >= limit)]
    if room:
        return min(room, key=lambda n: counts.get(n, 0))
    if able:
        raise not_started(
            Full(
                f"exceeds maximum queue size: every replica of {model}/{version} that could take "
                f"the request has {limit} in flight (max_ongoing_requests); retry later"
            )
        )
    raise no_worker(model, version)
