"""The store interface: what mcpmesh needs from etcd, and nothing about how it is reached.

The implementation over a real etcd lives in ``mcpcore.etcd_store``; logic modules (``lifecycle``) and
unit-test fakes depend only on this module, which does no I/O.

Invariants every implementation keeps:
- Keys are ``str`` (UTF-8), values ``bytes``. Revisions are etcd's: a key that does not exist has
  mod revision 0, so ``Compare(key, 0)`` means "the key must not exist yet".
- ``txn`` applies all its operations or none; it returns ``succeeded=False`` (never raises) when a compare
  fails, so callers decide which error a lost race is.
- Every call has a deadline; an unreachable store raises ``errors.Unavailable`` naming the endpoints.
- ``watch_prefix`` yields every event after ``start_revision`` exactly once, in revision order, also across
  reconnects (it resumes from the last revision it yielded); when the history it needs was compacted it
  raises ``WatchCompacted`` so the caller re-lists, and when the store's revision went back below what
  was yielded (restored from a snapshot, or its data lost) it raises ``StoreRewound`` (a
  ``WatchCompacted``: the caller re-lists the same way).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Compare",
    "Delete",
    "EventType",
    "KeepAlive",
    "KeyValue",
    "Lease",
    "Put",
    "Range",
    "Store",
    "StoreRewound",
    "TxnResult",
    "WatchCompacted",
    "WatchEvent",
]


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int = 0
    version: int = 0
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Range:
    """A prefix read: the items sorted by key, and the store revision they were read at."""

    items: tuple[KeyValue, ...]
    revision: int


class EventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    key: str
    value: bytes  # b"" for DELETE
    mod_revision: int
    prev_value: bytes | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    ttl: int  # seconds, as granted


@dataclass(frozen=True, slots=True)
class Compare:
    """True when ``key``'s mod revision equals ``mod_revision`` (0: the key does not exist)."""

    key: str
    mod_revision: int


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store revision after the transaction (or at the failed compare)


class WatchCompacted(Exception):
    """The revision a watch needs was compacted away: re-list with ``get_prefix`` and watch again."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"watch history compacted up to revision {compact_revision}; re-list and re-watch")
        self.compact_revision = compact_revision


class StoreRewound(WatchCompacted):
    """The store's revision is behind what a watch already yielded: its data was restored from an older
    snapshot or lost. Nothing after the restored revision can be trusted: re-list and watch again."""

    def __init__(self, revision: int, expected: int) -> None:
        Exception.__init__(
            self,
            f"the store went back to revision {revision} after revision {expected} was seen (restored "
            "from a snapshot, or its data lost); re-list and re-watch",
        )
        self.compact_revision = revision
        self.revision, self.expected = revision, expected


@dataclass
class KeepAlive:
    """A running lease refresher (see ``Store.keep_alive``). ``lost`` is set once the lease is gone."""

    lease: Lease
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None


class Store(abc.ABC):
    """What mcpmesh needs from a consistent key-value store with leases and watches."""

    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def get_prefix(self, prefix: str) -> Range: ...

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Store ``value``; returns the new store revision."""

    @abc.abstractmethod
    async def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under it); returns how many keys went."""

    @abc.abstractmethod
    async def txn(self, compares: Sequence[Compare], on_success: Sequence[Put | Delete]) -> TxnResult: ...

    @abc.abstractmethod
    async def grant_lease(self, ttl: int) -> Lease: ...

    @abc.abstractmethod
    async def refresh_lease(self, lease_id: int) -> int:
        """Renew once; returns the TTL left. Raises ``errors.NotFound`` when the lease has expired."""

    @abc.abstractmethod
    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke; its keys go at once. Revoking an expired lease is not an error."""

    @abc.abstractmethod
    def keep_alive(self, lease: Lease) -> KeepAlive:
        """Start refreshing ``lease`` in the background (about every TTL/3) until stopped or lost."""

    @abc.abstractmethod
    def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> AsyncIterator[list[WatchEvent]]:
        """Batches of events under ``prefix`` after ``start_revision`` (0: from now on)."""

    @abc.abstractmethod
    async def ping(self) -> int:
        """Check the store answers; returns its current revision. Raises ``errors.Unavailable``."""

    @abc.abstractmethod
    async def close(self) -> None: ...
