"""Fencing tokens: a deposed leader's etcd writes and worker calls take no effect.

A leader (``LeaderElection``) holds its election key at the mod revision it won it with. That pair is
its fencing token (``Fence``):

- every etcd write the leader makes carries ``fence.compare()`` in its transaction, so etcd itself
  rejects it once the key is gone or held by another leader, whatever the old process believes;
- every control call it makes to a worker carries the token in gRPC metadata (``FENCE_METADATA``:
  ``"<role>:<revision>"``), and the worker's ``FenceCheck`` refuses a token lower than the highest it has
  seen for that role, and one that etcd says is not the leader key's revision now.

Invariants of ``FenceCheck``:
1. A call without a token is an operator's or a tool's, not a leader's: it is let through.
2. A token whose revision etcd confirms as the leader key's current mod revision is accepted, also when it
   is lower than one seen before (etcd restored from a snapshot went back in revisions), and becomes the
   highest seen.
3. A token etcd does not confirm (key gone, or at another revision) is refused ``FAILED_PRECONDITION``.
4. While etcd cannot be reached, a token is accepted only if it is not lower than the highest seen: the
   worker still refuses every leader older than one it has heard from.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mcpcore.errors import FailedPrecondition, InvalidArgument, Unavailable
from mcpcore.keys import LEADER_ROLES, Keyspace
from mcpcore.store import Compare, Store

__all__ = ["FENCE_METADATA", "Fence", "FenceCheck", "parse_token"]

log = logging.getLogger(__name__)

FENCE_METADATA = "mcp-fence"


@dataclass(frozen=True)
class Fence:
    """A leader's token: its election key and the mod revision it won the key at."""

    role: str
    key: str
    revision: int

    def compare(self) -> Compare:
        """The compare every write of this leader carries: the key is still ours."""
        return Compare(self.key, self.revision)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """gRPC metadata for a control call made as this leader."""
        return ((FENCE_METADATA, f"{self.role}:{self.revision}"),)


def parse_token(value: str) -> tuple[str, int]:
    """``"<role>:<revision>"`` -> (role, revision); ``InvalidArgument`` naming what is wrong."""
    role, _, raw = value.partition(":")
    if role not in LEADER_ROLES or not raw.isdigit() or int(raw) <= 0:
        raise InvalidArgument(
            f"{FENCE_METADATA} {value!r}: expected '<role>:<revision>' with role one of "
            f"{sorted(LEADER_ROLES)} and a revision > 0"
        )
    return role, int(raw)


class FenceCheck:
    """The worker's side: refuse control calls from leaders that no longer lead (module invariants)."""

    def __init__(
        self,
        store: Store,
        keys: Keyspace,
        *,
        timeout_s: float = 1.0,
        on_refused: Callable[[str], None] = lambda role: None,
    ) -> None:
        self._store = store
        self._keys = keys
        self._timeout_s = timeout_s
        self._on_refused = on_refused
        self.highest: dict[str, int] = {}

    async def check(self, metadata: Iterable[tuple[str, str | bytes]] | None, what: str) -> None:
        token = next((v for k, v in metadata or () if k == FENCE_METADATA), None)
        if token is None:
            return
        role, revision = parse_token(token if isinstance(token, str) else token.decode("ascii", "replace"))
        seen = self.highest.get(role, 0)
        try:
            async with asyncio.timeout(self._timeout_s):
                current = await self._store.get(self._keys.leader(role))
        except (Unavailable, TimeoutError):
            if revision < seen:
                self._refuse(role, what, f"a newer {role} leader (revision {seen}) has acted here already")
            log.info("%s: etcd unreachable, %s leader revision %d let through (highest seen %d)",
                     what, role, revision, seen)  # fmt: skip
            self.highest[role] = revision
            return
        if current is None or current.mod_revision != revision:
            now = "no one leads" if current is None else f"the leader key is at {current.mod_revision}"
            self._refuse(role, what, f"{now}, not {revision}: the caller no longer leads")
        self.highest[role] = revision

    def _refuse(self, role: str, what: str, why: str) -> None:
        self._on_refused(role)
        log.warning("refused %s from a deposed %s leader: %s", what, role, why)
        raise FailedPrecondition(f"{what} refused: fenced, {why}")
