"""The router's pick (``routing.pick.pick_worker``) over fake links: bounded loads first, then the least
loaded worker that may take the request, then one handing its replicas over, and the errors that say why
none may."""

from __future__ import annotations

import pytest

from mcp_router.routing.pick import Full, pick_worker
from mcp_router.routing.ring import HashRing
from mcpcore.errors import Unavailable
from mcpcore.transport.forwarder import RingLoad

WORKERS = ["w0", "w1", "w2", "w3"]
RING = HashRing(dict.fromkeys(WORKERS, 1.0))


class Links:
    """Links by state: ``down`` take nothing, ``draining`` only what nobody else can take."""

    def __init__(self, down: set[str] = frozenset(), draining: set[str] = frozenset()) -> None:
        self.down, self.draining = set(down), set(draining)

    def usable(self, worker: str) -> bool:
        return worker not in self.down and worker not in self.draining

    def serving(self, worker: str) -> bool:
        return worker not in self.down


def loads(**counts: int) -> RingLoad:
    load = RingLoad()
    load.per_worker.update(counts)
    load.total = sum(counts.values())
    return load


def pick(load: RingLoad, links: Links, *, limit: int = 0, tried: frozenset[str] = frozenset()) -> str:
    return pick_worker(RING, "user-1", load, links, c=1.25, limit=limit, tried=tried, model="m", version="1")


def test_idle_goes_to_the_keys_owner_and_a_retry_elsewhere() -> None:
    owner = pick(loads(), Links())
    assert owner == RING.lookup_bounded("user-1", {})
    assert pick(loads(), Links(), tried=frozenset({owner})) != owner


def test_a_link_that_is_down_or_draining_is_passed_over() -> None:
    owner = pick(loads(), Links())
    assert pick(loads(), Links(down={owner})) != owner
    assert pick(loads(), Links(draining={owner})) != owner


def test_max_ongoing_sends_it_to_a_worker_with_room() -> None:
    owner = pick(loads(), Links())
    assert pick(loads(**{owner: 2}), Links(), limit=2) != owner


def test_every_worker_full_is_full_and_not_started() -> None:
    with pytest.raises(Full, match="exceeds maximum queue size") as err:
        pick(loads(**dict.fromkeys(WORKERS, 2)), Links(), limit=2)
    assert err.value.not_started and err.value.retryable


def test_only_draining_workers_left_still_serve() -> None:
    # every usable worker is at its limit: a worker handing its replicas over takes it meanwhile
    draining = {"w3"}
    full = dict.fromkeys(["w0", "w1", "w2"], 2)
    assert pick(loads(**full), Links(draining=draining), limit=2) == "w3"


def test_no_link_at_all_is_unavailable_not_started() -> None:
    with pytest.raises(Unavailable, match="no worker of model m version 1") as err:
        pick(loads(), Links(down=set(WORKERS)))
    assert not isinstance(err.value, Full) and err.value.not_started
