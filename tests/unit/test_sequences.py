"""Sequence placement and its faults (mcp_router.routing.sequences) over a real routing table's shape: pins,
tombstones that keep a lost sequence lost, the idle sweep, and one request per sequence at a time."""

from __future__ import annotations

import asyncio

import pytest

from mcp_router.dataplane import SequenceFlags
from mcp_router.routing.ring import HashRing
from mcp_router.routing.sequences import IDLE_S, SWEEP_EVERY, Sequences
from mcp_router.routing.table import ModelRoute, RoutingTable, WorkerEndpoint
from mcpcore.errors import Aborted, InvalidArgument


def _table(*workers: tuple[str, str]) -> tuple[ModelRoute, RoutingTable]:
    ids = [w for w, _ in workers]
    route = ModelRoute(name="m", routing=None, rings={"1": HashRing(dict.fromkeys(ids, 1.0))} if ids else {})
    table = RoutingTable(
        models={"m": route},
        workers={w: WorkerEndpoint(w, f"tcp://{w}", incarnation=inc) for w, inc in workers},
    )
    return route, table


def test_a_placed_sequence_stays_until_its_worker_is_gone_and_then_stays_lost():
    clock = [0.0]
    seqs = Sequences(clock=lambda: clock[0])
    route, table = _table(("w1", "a"), ("w2", "b"))
    start, next_ = SequenceFlags("7", start=True), SequenceFlags("7")
    assert seqs.placed(route, table, start, "", lambda w: True) is None  # a start: placed by its answer
    seqs.place("m", start, "1", "w1", "a")
    assert seqs.placed(route, table, next_, "", lambda w: True).worker == "w1"
    with pytest.raises(InvalidArgument, match="runs on version 1, not 2"):
        seqs.placed(route, table, next_, "2", lambda w: True)
    route, table = _table(("w1", "a-again"), ("w2", "b"))  # w1 restarted under its id
    with pytest.raises(Aborted, match="ran on worker w1, which restarted"):
        seqs.placed(route, table, next_, "", lambda w: True)
    with pytest.raises(Aborted, match="which restarted"):  # and stays lost: never adopted elsewhere
        seqs.placed(route, table, next_, "", lambda w: True)
    assert seqs.placed(route, table, start, "", lambda w: True) is None  # a new start begins it again
    seqs.place("m", start, "1", "w2", "b")
    assert seqs.placed(route, table, next_, "", lambda w: True).worker == "w2"


@pytest.mark.parametrize(
    ("workers", "serving", "why"),
    [
        ((("w2", "b"),), True, "left the routing table"),
        ((("w1", "a"),), False, "is disconnected or draining"),
    ],
)
def test_each_way_a_worker_goes_loses_the_sequence(workers, serving, why):
    seqs = Sequences()
    route, table = _table(("w1", "a"))
    seqs.place("m", SequenceFlags("s", start=True), "1", "w1", "a")
    route, table = _table(*workers)
    with pytest.raises(Aborted, match=why):
        seqs.placed(route, table, SequenceFlags("s"), "", lambda w: serving)


def test_unknown_sequences_are_adopted_and_ended_ones_forgotten():
    seqs = Sequences()
    route, table = _table(("w1", "a"))
    assert seqs.placed(route, table, SequenceFlags("x"), "", lambda w: True) is None  # another router's
    seqs.place("m", SequenceFlags("x"), "1", "w1", "a")
    seqs.end("m", SequenceFlags("x", end=True))
    assert len(seqs) == 0 and seqs.placed(route, table, SequenceFlags("x"), "", lambda w: True) is None


def test_idle_sequences_become_tombstones_and_old_tombstones_go():
    clock = [0.0]
    seqs = Sequences(clock=lambda: clock[0])
    route, table = _table(("w1", "a"))
    seqs.place("m", SequenceFlags("old"), "1", "w1", "a")
    clock[0] = IDLE_S + 1
    for i in range(SWEEP_EVERY - 1):  # the sweep comes with the SWEEP_EVERY-th pin
        seqs.place("m", SequenceFlags(f"n{i}"), "1", "w1", "a")
    with pytest.raises(Aborted, match="had no request for 600 s"):
        seqs.placed(route, table, SequenceFlags("old"), "", lambda w: True)
    clock[0] = 3 * IDLE_S
    for i in range(SWEEP_EVERY):
        seqs.place("m", SequenceFlags(f"m{i}"), "1", "w1", "a")
    assert seqs.placed(route, table, SequenceFlags("old"), "", lambda w: True) is None  # tombstone gone
    assert len(seqs) == SWEEP_EVERY  # the n* pins went idle too and were swept


async def test_one_request_per_sequence_at_a_time_in_order():
    seqs = Sequences()
    order: list[str] = []

    async def request(seq: str, name: str, hold: asyncio.Event | None = None) -> None:
        async with seqs.turn("m", SequenceFlags(seq)):
            order.append(f"{name}+")
            if hold is not None:
                await hold.wait()
            order.append(f"{name}-")

    hold = asyncio.Event()
    first = asyncio.create_task(request("s", "a", hold))
    await asyncio.sleep(0)  # a takes the turn
    second = asyncio.create_task(request("s", "b"))
    other = asyncio.create_task(request("t", "c"))  # another sequence does not wait
    await other
    assert order == ["a+", "c+", "c-"]
    hold.set()
    await asyncio.gather(first, second)
    assert order == ["a+", "c+", "c-", "a-", "b+", "b-"]
    assert not seqs._turns  # nothing kept once no request holds or waits
