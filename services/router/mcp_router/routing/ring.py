"""Consistent hashing over one (model, version)'s RUNNING replicas: weighted virtual nodes, bounded loads.

This fixes the article's ``ConsistentHash`` (DESIGN.md section 11 item 1): the ring is sorted once when it
is built, not on every lookup; each node gets ~100 virtual nodes per unit of capacity, not 3; and the hash
is named: xxh3_64, the same in every process (never Python's salted ``hash()``).

Invariants:
- A ``HashRing`` is immutable: a membership change builds a new ring, which the routing table swaps in
  whole, so a lookup never sees a half-built ring.
- A virtual node's position depends only on its own node id and index (``xxh3_64(f"{node}#{i}")``), so
  adding or removing a node moves only the keys that land on that node's arcs: ~1/n of them.
- A key belongs to the first virtual node at or clockwise after ``xxh3_64(key)``, wrapping at 2**64; most
  keys find it in a bucket table (one shift, one index), the rest by ``bisect``, with the same answer.
- ``lookup_bounded`` is the router's one lookup (``routing.pick``): the owner when it is below its cap,
  else the next distinct nodes in ring order; nodes in ``exclude`` (tried) are passed over and the caps
  are shared among the others. An empty ring raises ``EmptyRing`` (an ``Unavailable``: retryable).

Pure: no I/O, nothing here knows about gRPC, ZeroMQ or etcd.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Set
from itertools import repeat
from types import MappingProxyType

from xxhash import xxh3_64_intdigest

from mcpcore.errors import Unavailable

__all__ = ["DEFAULT_VNODES_PER_UNIT", "EmptyRing", "HashRing"]

DEFAULT_VNODES_PER_UNIT = 100
_MAX_TABLE_BITS = 20  # the bucket table never takes more than 8 MiB, whatever the ring's size


class EmptyRing(Unavailable):
    """No node to route to. Retryable: replicas may come back."""

    def __init__(self, message: str = "no RUNNING replica to route to") -> None:
        super().__init__(message)


def _vnode_hashes(node: str, weight: float, vnodes_per_unit: int) -> tuple[int, ...]:
    if not (weight > 0 and math.isfinite(weight)):
        raise ValueError(f"node {node!r}: capacity weight must be a positive finite number, got {weight!r}")
    count = max(1, round(weight * vnodes_per_unit))
    return tuple(xxh3_64_intdigest(f"{node}#{i}".encode()) for i in range(count))


def _bucket_table(hashes: list[int], owners: list[str]) -> tuple[list[str | None], int]:
    """A direct-mapped shortcut for finding a key's owner: the hash space cut into 2**bits equal buckets.

    A bucket that holds no virtual node has one owner for every key in it (the next vnode's): the table
    stores it, and a lookup is a shift and an index. A bucket that holds a vnode stores None, and the lookup
    falls back to ``bisect``. Between 4 and 8 buckets per vnode leave ~80% of keys on the shortcut (the
    bisect over 64-bit ints is most of a lookup's time) for 32 to 64 bytes per vnode.
    """
    if not hashes:
        return [None], 64  # every hash >> 64 is 0: an empty ring is refused before the table is read
    bits = min(_MAX_TABLE_BITS, (len(hashes) - 1).bit_length() + 2)
    shift = 64 - bits
    table: list[str | None] = [None] * (1 << bits)
    free = 0  # the first bucket that no vnode seen so far lies in or before
    for index, h in enumerate(hashes):
        bucket = h >> shift
        if bucket > free:
            table[free:bucket] = [owners[index]] * (bucket - free)
        free = max(free, bucket + 1)
    table[free:] = [owners[len(hashes)]] * (len(table) - free)  # past the last vnode: wrap to the first
    return table, shift


class HashRing:
    """An immutable weighted consistent-hash ring: ``HashRing({"w1": 1.0, "w2": 2.0})``.

    ``nodes`` maps node id to capacity weight; a node gets ``max(1, round(weight * vnodes_per_unit))``
    virtual nodes, so a node of weight 2 owns about twice the keys of a node of weight 1.
    """

    __slots__ = ("_hashes", "_nodes", "_owners", "_shares", "_shift", "_table")

    def __init__(self, nodes: Mapping[str, float], *, vnodes_per_unit: int = DEFAULT_VNODES_PER_UNIT) -> None:
        if vnodes_per_unit < 1:
            raise ValueError(f"vnodes_per_unit must be at least 1, got {vnodes_per_unit}")
        weights = dict(nodes)
        # Ties between equal hashes (2**-64 apart, but possible) break by node id, so every process
        # builds the same ring from the same membership whatever the mapping's order.
        points = sorted(
            (h, node)
            for node, weight in weights.items()
            for h in _vnode_hashes(node, weight, vnodes_per_unit)
        )
        self._hashes: list[int] = [h for h, _ in points]
        # One extra owner past the end: a key hashing after the last vnode wraps to the first one, with
        # no branch for it.
        self._owners: list[str] = ([node for _, node in points] + [points[0][1]]) if points else []
        self._table, self._shift = _bucket_table(self._hashes, self._owners)
        self._nodes: Mapping[str, float] = MappingProxyType(weights)
        total = sum(weights.values())
        # each node's fraction of the ring's weight: its bounded-load cap is that fraction of c * (total + 1)
        self._shares = {n: w / total for n, w in weights.items()}

    @property
    def nodes(self) -> Mapping[str, float]:
        """Node id -> capacity weight (read-only)."""
        return self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        return f"HashRing({dict(self._nodes)!r})"

    def _walk(self, start: int, want: int) -> Iterator[str]:
        """Distinct nodes in ring order from vnode ``start``: the owner first, then where an overflow goes."""
        owners, size = self._owners, len(self._hashes)
        seen: set[str] = set()
        for step in range(size):
            if len(seen) >= want:
                return
            node = owners[(start + step) % size]
            if node not in seen:
                seen.add(node)
                yield node

    def lookup_bounded(
        self,
        key: str | bytes,
        loads: Mapping[str, int],
        c: float = 1.25,
        *,
        total: int | None = None,
        exclude: Set[str] = frozenset(),
        usable: Callable[[str], bool] | None = None,
    ) -> str | None:
        """Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018).

        ``loads`` is each node's in-flight count (absent = 0); ``total`` is their sum over this ring's nodes
        (computed from ``loads`` when not given; a router that keeps a running sum passes it, so a lookup
        stays O(log v)). A node may take the request while its load is below its cap,
        ``ceil(c * (total + 1) * weight / sum(weights))``, which is ``ceil(c * (total + 1) / n)`` when the
        weights are equal. The owner is tried first, then the next distinct nodes in ring order, so a hot
        key overflows to the same few neighbours every time. Nodes in ``exclude`` are never chosen; the
        caps are then shared among the others (``total`` and the weights count only them). ``usable`` is a
        check asked only of the nodes walked (owner first: usually one call), for conditions too costly
        to gather for every node per request (a link down, a per-replica limit); the caps stay those of
        the whole ring.

        Returns None when no node may take it: every one is excluded, unusable or at its cap. With ``c >= 1``
        and every node usable the latter cannot happen while ``total`` is the true sum of non-negative
        loads, because the caps add up to at least ``total + 1``. Raises ``EmptyRing`` on an empty ring.
        """
        hashes = self._hashes
        if not hashes:
            raise EmptyRing()
        shares = self._shares
        if exclude:  # a retry: the caps are shared among the nodes left
            kept = [n for n in shares if n not in exclude]
            if not kept:
                return None
            total = sum(map(loads.get, kept, repeat(0)))
            kept_weight = sum(self._nodes[n] for n in kept)
            shares = {n: self._nodes[n] / kept_weight for n in kept}
        elif total is None:
            total = sum(map(loads.get, shares, repeat(0)))
        # A node takes the request while load < ceil(c * (total + 1) * w / W); for an integer load that is
        # load < c * (total + 1) * w / W, so no ceil() is needed (nor its cost on every request). The
        # 1e-12 keeps a cap that is exactly an integer from passing for one more through rounding.
        budget = c * (total + 1) * (1 - 1e-12)
        h = xxh3_64_intdigest(key.encode() if isinstance(key, str) else key)
        owner = self._table[h >> self._shift] or self._owners[bisect_left(hashes, h)]
        if (
            owner in shares
            and loads.get(owner, 0) < budget * shares[owner]
            and (usable is None or usable(owner))
        ):
            return owner  # the common case: one table read, no generator, no set
        for node in self._walk(bisect_left(hashes, h), len(self._nodes)):
            share = shares.get(node)
            if share is not None and loads.get(node, 0) < budget * share and (usable is None or usable(node)):
                return node
        return None
