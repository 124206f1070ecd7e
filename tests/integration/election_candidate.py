"""A leader-election candidate in a process of its own, for tests that ``kill -9`` a leader.

Usage: ``python election_candidate.py ENDPOINT KEY CANDIDATE TTL``. Prints ``leader`` on stdout once it
leads, then holds the lead until it is killed.
"""

from __future__ import annotations

import asyncio
import sys

from mcpcore.election import LeaderElection
from mcpcore.etcd_store import EtcdStore


async def main(endpoint: str, key: str, candidate: str, ttl: int) -> None:
    async with EtcdStore([endpoint]) as store:
        leading = asyncio.Event()

        async def on_change(lead: bool) -> None:
            if lead:
                leading.set()

        election = LeaderElection(store, key, candidate, ttl=ttl, on_change=on_change)
        await election.start()
        await leading.wait()
        print("leader", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
