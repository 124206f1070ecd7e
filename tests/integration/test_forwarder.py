"""The router's forwarder against a real ZeroMQ peer it does not control: ids, late and bad replies, links.

The peer is a ROUTER socket driven by the test, so each outcome (a reply held back past the deadline, a
reply whose frames do not match its header, a peer that vanishes mid-request) happens exactly when the
test says, on real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import zmq
import zmq.asyncio

from mcp_router.config import RouterConfig
from mcp_router.routing.table import WorkerEndpoint
from mcp_router.server import RouterServer
from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.config import load_config
from mcpcore.errors import DeadlineExceeded, Internal
from mcpcore.transport import shm_lease
from mcpcore.transport.forwarder import Forwarder, MayHaveStarted, NotSent, link_address

X = np.arange(8, dtype=np.float32).reshape(2, 4)


class Peer:
    """A worker stand-in: receives requests and answers only when told."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str = "tcp://127.0.0.1:*") -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def request(self) -> tuple[bytes, tensor_pb2.TensorHeader, list[bytes]]:
        identity, *frames = await self.sock.recv_multipart()
        return identity, wire.parse_header(frames[0]), frames[1:]

    async def reply(self, identity: bytes, header: tensor_pb2.TensorHeader, frames: list) -> None:  # type: ignore[type-arg]
        await self.sock.send_multipart([identity, header.SerializeToString(), *frames])


BATCH = frozenset({wire.FEATURE_BATCH})


@pytest.fixture(params=[frozenset(), BATCH], ids=["single", "coalescing"])
async def setup(request):
    """A forwarder linked to one peer, which takes single messages only, or coalesced ones too: every
    outcome below holds both ways."""
    ctx = zmq.asyncio.Context()
    peer = Peer(ctx)
    late: list[int] = []
    down: list[str] = []
    fwd = Forwarder(
        heartbeat_s=0.1, heartbeat_timeout_s=0.5, on_late=lambda: late.append(1), on_link_down=down.append
    )
    fwd.sync({"w1": WorkerEndpoint("w1", peer.endpoint, zmq_features=request.param)})
    for _ in range(200):  # the handshake: the link is up once the peer answered ZMTP
        if fwd.link_ok("w1"):
            break
        await asyncio.sleep(0.01)
    assert fwd.link_ok("w1")
    yield fwd, peer, late, down
    await fwd.close()
    peer.sock.close(0)
    ctx.term()


def request(fwd: Forwarder, model: str = "m") -> tensor_pb2.TensorHeader:
    return tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id=fwd.new_id(), model=model)


def ok_reply(header: tensor_pb2.TensorHeader) -> tensor_pb2.TensorHeader:
    return tensor_pb2.TensorHeader(
        kind=tensor_pb2.KIND_REPLY, request_id=header.request_id, model=header.model
    )


async def test_the_wire_id_is_the_routers_own_and_unique(setup):
    fwd, _, _, _ = setup
    ids = {fwd.new_id() for _ in range(10_000)}
    assert len(ids) == 10_000
    other = Forwarder()
    assert not ids & {other.new_id() for _ in range(100)}  # another router process: another prefix
    await other.close()


async def test_a_late_reply_is_dropped_counted_and_the_load_held_until_it_comes(setup):
    fwd, peer, late, _ = setup
    header = request(fwd)
    sending = asyncio.create_task(fwd.send("w1", header, {"X": X}, timeout_s=0.05))
    identity, got, _ = await peer.request()
    with pytest.raises(DeadlineExceeded):
        await sending
    assert fwd.loads["w1"] == 1  # given up, but the worker still holds it: bounded loads count it
    _, cancel, frames = await asyncio.wait_for(peer.request(), 5)  # and is told so: its cancel, header only
    assert cancel.kind == tensor_pb2.KIND_CANCEL and cancel.request_id == header.request_id and not frames
    await peer.reply(identity, ok_reply(got), [])
    for _ in range(200):
        if late:
            break
        await asyncio.sleep(0.005)
    assert late == [1] and fwd.loads["w1"] == 0
    # the next request gets its own reply, not the late one
    nxt = request(fwd)
    sending = asyncio.create_task(fwd.send("w1", nxt, {"X": X}, timeout_s=5))
    identity, got, _ = await peer.request()
    assert got.request_id == nxt.request_id != header.request_id
    await peer.reply(identity, ok_reply(got), [])
    assert (await sending).header.request_id == nxt.request_id


async def test_each_request_fails_at_its_own_deadline_and_answered_ones_are_not_kept(setup):
    fwd, peer, _, _ = setup
    loop = asyncio.get_running_loop()
    began = loop.time()
    timeouts = (0.15, 0.05, 0.1)
    sending = [asyncio.create_task(fwd.send("w1", request(fwd), {"X": X}, timeout_s=t)) for t in timeouts]
    failed_at = {}
    for t, task in zip(timeouts, sending, strict=True):
        task.add_done_callback(lambda _, t=t: failed_at.setdefault(t, loop.time() - began))
    for task in sending:
        with pytest.raises(DeadlineExceeded, match=r"did not answer within \d+ ms"):
            await task
    assert sorted(failed_at, key=failed_at.get) == sorted(timeouts)  # in deadline order
    assert all(failed_at[t] >= t - 0.002 for t in timeouts)  # at most its 2 ms slot before its deadline
    # answered requests leave nothing behind in the deadline slots
    for _ in range(3):
        await peer.request()  # the three given up on (their cancels follow)
    answered = []
    for _ in range(20):
        task = asyncio.create_task(fwd.send("w1", request(fwd), {"X": X}, timeout_s=30))
        while True:
            identity, got, _ = await peer.request()
            if got.kind == tensor_pb2.KIND_REQUEST:
                break
        await peer.reply(identity, ok_reply(got), [])
        answered.append(await task)
    assert len(answered) == 20
    assert fwd.deadlines.due == {}  # no slot (and no timer) is kept for requests that ended


async def test_a_client_that_goes_away_cancels_at_the_worker_and_leaves_no_deadline_behind(setup):
    fwd, peer, _, _ = setup
    header = request(fwd)
    sending = asyncio.create_task(fwd.send("w1", header, {"X": X}, timeout_s=30))
    identity, got, _ = await peer.request()
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    _, cancel, frames = await asyncio.wait_for(peer.request(), 5)
    assert cancel.kind == tensor_pb2.KIND_CANCEL and cancel.request_id == header.request_id and not frames
    assert fwd.deadlines.due == {}
    assert fwd.loads["w1"] == 1  # the worker still holds it until it answers
    await peer.reply(identity, ok_reply(got), [])


async def test_a_deadline_that_comes_before_the_links_flush_sends_nothing():
    """A request whose deadline slot is already due when it is sent on a coalescing link fails there,
    before its flush: it never leaves, so the worker gets neither it nor a cancel."""
    ctx = zmq.asyncio.Context()
    peer = Peer(ctx)
    fwd = Forwarder(heartbeat_s=0.1, heartbeat_timeout_s=0.5)
    fwd.sync({"w1": WorkerEndpoint("w1", peer.endpoint, zmq_features=BATCH)})
    for _ in range(200):
        if fwd.link_ok("w1"):
            break
        await asyncio.sleep(0.01)
    header = request(fwd)
    loop = asyncio.get_running_loop()
    sending = asyncio.create_task(fwd.send("w1", header, {"X": X}, timeout_s=30))

    def slot_comes_due() -> None:  # runs after the send's first step, before the flush it scheduled
        entry = fwd._links["w1"].pending[header.request_id]
        assert header.request_id in fwd._links["w1"].outbox
        fwd.deadlines.expire(entry.slot)

    loop.call_soon(slot_comes_due)
    with pytest.raises(DeadlineExceeded):
        await sending
    assert fwd.loads["w1"] == 0 and fwd.deadlines.due == {}
    nxt = request(fwd)
    answer = asyncio.create_task(fwd.send("w1", nxt, {"X": X}, timeout_s=5))
    identity, first, _ = await asyncio.wait_for(peer.request(), 5)
    assert first.request_id == nxt.request_id  # the first thing the worker ever got
    await peer.reply(identity, ok_reply(first), [])
    await answer
    await fwd.close()
    peer.sock.close(0)
    ctx.term()


async def test_a_reply_that_does_not_decode_fails_its_request_at_once(setup):
    fwd, peer, _, _ = setup
    sending = asyncio.create_task(fwd.send("w1", request(fwd), {"X": X}, timeout_s=30))
    identity, got, _ = await peer.request()
    bad = ok_reply(got)
    bad.tensors.add(name="Y", dtype=tensor_pb2.TYPE_FP32, shape=[4], byte_size=16)
    await peer.reply(identity, bad, [b"\0" * 3])  # 3 bytes where the header says 16
    with pytest.raises(Internal, match=r"w1 sent a reply that does not decode.*3 bytes"):
        async with asyncio.timeout(5):
            await sending
    assert fwd.loads["w1"] == 0


async def test_a_worker_that_vanishes_mid_request_may_have_started_it(setup):
    fwd, peer, _, down = setup
    sending = asyncio.create_task(fwd.send("w1", request(fwd), {"X": X}, timeout_s=30))
    await peer.request()  # the worker has it
    peer.sock.close(0)  # ... and vanishes
    with pytest.raises(MayHaveStarted, match="w1 disconnected"):
        async with asyncio.timeout(10):
            await sending
    assert down == ["w1"] and not fwd.link_ok("w1")
    with pytest.raises(NotSent, match="not connected"):  # nothing more is sent: provably not started
        await fwd.send("w1", request(fwd), {"X": X}, timeout_s=1)


async def test_a_draining_worker_and_one_over_its_bound_get_nothing(setup):
    fwd, peer, _, _ = setup
    fwd.mark_draining("w1")
    with pytest.raises(NotSent, match="draining"):
        await fwd.send("w1", request(fwd), {"X": X}, timeout_s=1)
    small = Forwarder(max_in_flight=1)
    small.sync({"w1": WorkerEndpoint("w1", peer.endpoint)})
    for _ in range(200):
        if small.link_ok("w1"):
            break
        await asyncio.sleep(0.01)
    held = asyncio.create_task(small.send("w1", request(small), {"X": X}, timeout_s=30))
    await peer.request()
    with pytest.raises(NotSent, match="exceeds maximum queue size"):
        await small.send("w1", request(small), {"X": X}, timeout_s=1)
    held.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await held
    await small.close()


@pytest.mark.parametrize("features", [frozenset(), BATCH], ids=["single", "coalescing"])
async def test_a_worker_that_never_listened_is_not_sent_anything(features):
    fwd = Forwarder()
    fwd.sync({"w9": WorkerEndpoint("w9", "tcp://127.0.0.1:9", zmq_features=features)})  # nothing listens
    with pytest.raises(NotSent):
        await fwd.send("w9", request(fwd), {"X": X}, timeout_s=1)
    assert fwd.loads["w9"] == 0
    await fwd.close()


def _partial(header: tensor_pb2.TensorHeader, answer: int | None) -> list:  # type: ignore[type-arg]
    """A decoupled model's answer ``answer`` (None: without its place) to ``header``, as frames."""
    reply = ok_reply(header)
    reply.flags = wire.FLAG_PARTIAL
    if answer is not None:
        reply.parameters[wire.PARAM_ANSWER] = str(answer)
    return wire.encode(reply, {"INDEX": np.array([answer or 0], np.int32)})


async def test_partial_answers_go_to_the_request_in_order_then_its_last_reply(setup):
    fwd, peer, late, _ = setup
    header = request(fwd)
    got: list[int] = []
    send = asyncio.create_task(
        fwd.send(
            "w1", header, {"X": X}, timeout_s=5, on_partial=lambda m: got.append(int(m.named()["INDEX"][0]))
        )
    )
    identity, seen, _ = await peer.request()
    for i in range(3):
        frames = _partial(seen, i)
        await peer.reply(identity, wire.parse_header(frames[0]), frames[1:])
    await peer.reply(identity, ok_reply(seen), [])
    last = await send
    assert got == [0, 1, 2] and not last.tensors and not late
    assert fwd.in_flight("w1") == 0


@pytest.mark.parametrize(("answers", "error", "words"), [
    ([0, 2], "DataLoss", "sent answer 2 of model m but answer 1 was next"),  # one was dropped on the way
    ([None], "DataLoss", "sent answer None"),
])  # fmt: skip
async def test_a_gap_in_the_answers_fails_the_request(setup, answers, error, words):
    fwd, peer, _, _ = setup
    header = request(fwd)
    send = asyncio.create_task(fwd.send("w1", header, {"X": X}, timeout_s=5, on_partial=lambda m: None))
    identity, seen, _ = await peer.request()
    for i in answers:
        frames = _partial(seen, i)
        await peer.reply(identity, wire.parse_header(frames[0]), frames[1:])
    with pytest.raises(Exception, match=words) as info:
        await send
    assert type(info.value).__name__ == error
    await peer.reply(identity, ok_reply(seen), [])  # its last reply still ends it: nothing stays in flight
    for _ in range(200):
        if fwd.in_flight("w1") == 0:
            break
        await asyncio.sleep(0.01)
    assert fwd.in_flight("w1") == 0


async def test_a_second_answer_to_a_request_that_expects_one_fails_it(setup):
    fwd, peer, _, _ = setup
    header = request(fwd)
    send = asyncio.create_task(fwd.send("w1", header, {"X": X}, timeout_s=5))
    identity, seen, _ = await peer.request()
    frames = _partial(seen, 0)
    await peer.reply(identity, wire.parse_header(frames[0]), frames[1:])
    with pytest.raises(Internal, match="answered a request more than once"):
        await send


@pytest.mark.skipif(not shm_lease.AVAILABLE, reason="same-host shared memory is Linux-only")
async def test_a_lent_region_is_spoiled_when_its_last_reply_can_no_longer_come(setup):
    """A request that lent shared memory and failed early (here: answered twice) is still held by its
    worker; when the link then fails, no last reply will say the worker is done with the region, so the
    region is spoiled (never reused). One whose last reply came is not. (The peer here is no same-host
    worker, so the leases are handed to the forwarder's sending step directly.)"""
    fwd, peer, _, down = setup
    pool = shm_lease.RegionPool(max_region_bytes=1 << 24)
    answered, failed = pool.lease([X]), pool.lease([X])
    done = asyncio.create_task(
        fwd._send("w1", request(fwd), {"X": X}, timeout_s=30, nbytes=0, on_partial=None, shared=answered)
    )
    identity, seen, frames = await peer.request()
    assert seen.flags & wire.FLAG_SHARED_MEMORY and seen.HasField("reply_region") and not frames
    await peer.reply(identity, ok_reply(seen), [])
    await done
    send = asyncio.create_task(
        fwd._send("w1", request(fwd), {"X": X}, timeout_s=30, nbytes=0, on_partial=None, shared=failed)
    )
    identity, seen, _ = await peer.request()
    twice = _partial(seen, 0)
    await peer.reply(identity, wire.parse_header(twice[0]), twice[1:])
    with pytest.raises(Internal, match="answered a request more than once"):
        await send
    assert fwd.in_flight("w1") == 1 and not failed.spoiled[0]  # the worker still holds it
    peer.sock.close(0)
    for _ in range(1000):  # its heartbeat notices within a second
        if down:
            break
        await asyncio.sleep(0.01)
    assert down and failed.spoiled[0] and not answered.spoiled[0]


# -- coalescing: requests for one worker in one loop iteration leave as one message -------------------


@contextlib.asynccontextmanager
async def linked(**options: Any) -> AsyncIterator[tuple[Forwarder, Peer]]:
    """A forwarder made with ``options``, linked to one fresh peer that takes coalesced messages (the link
    up once ZMTP's handshake is done); closed afterwards."""
    ctx = zmq.asyncio.Context()
    peer = Peer(ctx)
    fwd = Forwarder(**options)
    fwd.sync({"w1": WorkerEndpoint("w1", peer.endpoint, zmq_features=BATCH)})
    try:
        for _ in range(200):
            if fwd.link_ok("w1"):
                break
            await asyncio.sleep(0.01)
        assert fwd.link_ok("w1")
        yield fwd, peer
    finally:
        await fwd.close()
        peer.sock.close(0)
        ctx.term()


async def raw_message(peer: Peer) -> tuple[bytes, tensor_pb2.TensorHeader, list[bytes]]:
    identity, *frames = await asyncio.wait_for(peer.sock.recv_multipart(), 5)
    return identity, wire.parse_header(frames[0]), frames[1:]


async def test_requests_of_one_iteration_leave_coalesced_and_each_gets_its_own_reply(setup):
    fwd, peer, _, _ = setup
    coalescing = wire.FEATURE_BATCH in fwd._links["w1"].endpoint.zmq_features
    inputs = [np.full((1, 4), i, np.float32) for i in range(10)]
    headers = [request(fwd) for _ in inputs]
    sending = [
        asyncio.create_task(fwd.send("w1", h, {"X": x}, timeout_s=5))
        for h, x in zip(headers, inputs, strict=True)
    ]
    got: list[tuple[tensor_pb2.TensorHeader, list[bytes]]] = []
    identity, first, frames = await raw_message(peer)
    if coalescing:  # all ten in one message, each header with its own tensor
        assert first.kind == wire.KIND_BATCH
        got = [(h, list(t)) for h, t in wire.uncoalesce(first, frames)]
    else:  # one message each, as older workers take them
        got = [(first, frames)] + [(h, f) for _, h, f in [await raw_message(peer) for _ in range(9)]]
    assert [h.request_id for h, _ in got] == [h.request_id for h in headers]
    # the replies: nine coalesced out of order, one single; each carries its request's tensor doubled
    replies = [
        wire.encode(ok_reply(h), {"Y": np.frombuffer(t[0], np.float32).reshape(1, 4) * 2}) for h, t in got
    ]
    [(count, batch)] = wire.coalesce(replies[:0:-1])
    assert count == 9
    await peer.sock.send_multipart([identity, *batch])
    await peer.sock.send_multipart([identity, *replies[0]])
    results = await asyncio.wait_for(asyncio.gather(*sending), 5)
    for msg, h, x in zip(results, headers, inputs, strict=True):
        assert msg.header.request_id == h.request_id
        np.testing.assert_array_equal(msg.tensors[0], x * 2)
    assert fwd.loads["w1"] == 0


@pytest.mark.parametrize(
    ("flush_at", "early", "sizes"), [(4, 8, [4, 4, 2]), (5, 10, [5, 5]), (0, 0, [10]), (16, 0, [10])]
)
async def test_a_full_outbox_leaves_at_once_and_the_rest_at_the_next_iteration(flush_at, early, sizes):
    """``flush_at`` requests waiting for one worker leave without waiting for the iteration to end, so the
    worker starts on them sooner; what is left leaves at the next iteration; 0 keeps them all for it."""
    async with linked(flush_at=flush_at) as (fwd, peer):
        headers = [request(fwd) for _ in range(10)]
        sending = [asyncio.create_task(fwd.send("w1", h, {"X": X}, timeout_s=5)) for h in headers]
        await asyncio.sleep(0)  # every send ran in this one iteration: full outboxes left during it
        assert len(headers) - len(fwd._links["w1"].outbox) == early
        got, ids = [], []
        for _ in sizes:
            identity, first, frames = await raw_message(peer)
            parts = wire.uncoalesce(first, frames) if first.kind == wire.KIND_BATCH else [(first, frames)]
            got.append(len(parts))
            ids += [h.request_id for h, _ in parts]
            for h, _ in parts:
                await peer.reply(identity, ok_reply(h), [])
        assert got == sizes
        assert ids == [h.request_id for h in headers]  # in order, each once
        assert not await peer.sock.poll(100)  # and nothing more: no empty or repeated message
        results = await asyncio.wait_for(asyncio.gather(*sending), 5)
        assert [m.header.request_id for m in results] == ids
        assert fwd.loads["w1"] == 0


async def test_requests_whose_early_send_is_refused_fail_not_sent_the_callers_too(monkeypatch):
    """A full outbox sent during the iteration and refused by the socket: each of its requests fails
    ``NotSent`` (they never left), the one whose send filled it included; none stays counted or due,
    and the link takes the next request as before."""
    async with linked(flush_at=4) as (fwd, peer):
        link = fwd._links["w1"]

        def refuse(*args: object, **kwargs: object) -> None:
            raise zmq.Again()

        monkeypatch.setattr(link.sock, "send_multipart", refuse)
        sending = [asyncio.create_task(fwd.send("w1", request(fwd), {"X": X}, timeout_s=5)) for _ in range(4)]
        await asyncio.sleep(0)
        assert link.outbox == {}  # tried at once, within the iteration
        results = await asyncio.wait_for(asyncio.gather(*sending, return_exceptions=True), 5)
        assert [type(r) for r in results] == [NotSent] * 4
        assert all("link is full or not connected" in str(r) for r in results)
        assert fwd.loads["w1"] == 0 and fwd.deadlines.due == {} and link.pending == {}
        monkeypatch.undo()
        header = request(fwd)
        answered = asyncio.create_task(fwd.send("w1", header, {"X": X}, timeout_s=5))
        identity, got, _ = await raw_message(peer)
        assert got.request_id == header.request_id
        await peer.reply(identity, ok_reply(got), [])
        assert (await asyncio.wait_for(answered, 5)).header.request_id == header.request_id


@pytest.mark.parametrize("value", ["0", "3"])
async def test_the_router_hands_its_coalesce_flush_at_to_its_forwarder(value):
    config = load_config(RouterConfig, env={"MCP_ROUTER_COALESCE_FLUSH_AT": value}, env_prefix="MCP_ROUTER_")
    router = RouterServer(config)
    try:
        assert router.forwarder.outboxes.flush_at == int(value)
    finally:
        await router.forwarder.close()


def test_a_negative_flush_at_is_refused():
    with pytest.raises(ValueError, match="flush_at: must be >= 0"):
        Forwarder(flush_at=-1)


async def test_a_request_still_waiting_to_leave_when_its_link_fails_was_not_sent():
    async with linked() as (fwd, _peer):
        sending = [asyncio.create_task(fwd.send("w1", request(fwd), {"X": X}, timeout_s=5)) for _ in range(3)]
        await asyncio.sleep(0)  # the sends ran: their requests wait for this iteration's flush
        assert fwd.loads["w1"] == 3
        fwd.sync({})  # the worker left the table before they left
        for task in sending:
            with pytest.raises(NotSent, match="before the request was sent"):  # not MayHaveStarted
                await task


async def test_coalesced_replies_that_do_not_add_up_fail_each_request_at_once(setup):
    fwd, peer, late, _ = setup
    headers = [request(fwd) for _ in range(2)]
    sending = [asyncio.create_task(fwd.send("w1", h, {"X": X}, timeout_s=30)) for h in headers]
    identity, *_ = await raw_message(peer)
    if wire.FEATURE_BATCH not in fwd._links["w1"].endpoint.zmq_features:
        await raw_message(peer)
    replies = [wire.encode(ok_reply(h), {"Y": X}) for h in headers]
    [(_, batch)] = wire.coalesce(replies)
    await peer.sock.send_multipart([identity, *batch[:-1]])  # one tensor frame short
    for task in sending:
        with pytest.raises(Internal, match="w1 sent replies that do not decode"):
            await asyncio.wait_for(task, 5)
    assert fwd.loads["w1"] == 0 and not late


async def _answered_by(fwd: Forwarder, peer: Peer) -> None:
    """One request through ``fwd`` to "w1", answered by ``peer`` (so it reached that socket)."""
    sending = asyncio.create_task(fwd.send("w1", request(fwd), {"X": X}, timeout_s=5))
    identity, got, _ = await asyncio.wait_for(peer.request(), 5)
    await peer.reply(identity, ok_reply(got), [])
    await sending


async def test_a_link_takes_the_same_host_endpoint_and_a_new_one_when_the_worker_restarts():
    """A record with FEATURE_LOCAL: the link connects to the local name of its incarnation; the same worker
    at the same TCP endpoint with a new incarnation (restarted) gets a new link to the new name. A record
    whose local name nobody listens on (another host) is reached at its TCP endpoint."""
    ctx = zmq.asyncio.Context()
    tcp = Peer(ctx)
    first = Peer(ctx, wire.local_endpoint("w1", "inc-a", tcp.endpoint))
    fwd = Forwarder(heartbeat_s=0.1, heartbeat_timeout_s=0.5)
    local = frozenset({wire.FEATURE_LOCAL})
    try:
        fwd.sync({"w1": WorkerEndpoint("w1", tcp.endpoint, incarnation="inc-a", zmq_features=local)})
        assert fwd.address("w1") == first.endpoint
        assert await fwd.wait_connected("w1", 5)
        await _answered_by(fwd, first)
        first.sock.close(0)  # the process is gone; a new one binds its own name
        second = Peer(ctx, wire.local_endpoint("w1", "inc-b", tcp.endpoint))
        fwd.sync({"w1": WorkerEndpoint("w1", tcp.endpoint, incarnation="inc-b", zmq_features=local)})
        assert fwd.address("w1") == second.endpoint
        assert await fwd.wait_connected("w1", 5)
        await _answered_by(fwd, second)
        # a record naming another endpoint or key names another socket (nobody's here): the published one
        moved = WorkerEndpoint("w1", tcp.endpoint, "key", incarnation="inc-b", zmq_features=local)
        assert wire.local_endpoint("w1", "inc-b", tcp.endpoint, "key") != second.endpoint
        assert link_address(moved) == tcp.endpoint
        second.sock.close(0)
        fwd.sync({"w1": WorkerEndpoint("w1", tcp.endpoint, incarnation="inc-c", zmq_features=local)})
        assert fwd.address("w1") == tcp.endpoint  # nothing listens on inc-c's name here
        assert await fwd.wait_connected("w1", 5)
        await _answered_by(fwd, tcp)
    finally:
        await fwd.close()
        tcp.sock.close(0)
        ctx.term()


def test_a_worker_published_at_another_hosts_address_is_never_looked_for_here():
    """A local process that binds the same-host name of a worker published at another host's address (a
    squatter) gets nothing: the link goes to the published endpoint. 192.0.2.1 (TEST-NET-1) is no address
    of this machine; nothing is sent anywhere, ``link_address`` only chooses."""
    ctx = zmq.Context()
    remote = "tcp://192.0.2.1:5555"
    squatter = ctx.socket(zmq.ROUTER)
    try:
        squatter.bind(wire.local_endpoint("w1", "inc-a", remote))
        target = WorkerEndpoint(
            "w1", remote, incarnation="inc-a", zmq_features=frozenset({wire.FEATURE_LOCAL})
        )
        assert link_address(target) == remote
        here = wire.local_endpoint("w1", "inc-a", "tcp://127.0.0.1:5555")
        squatter.bind(here)  # the same record at a loopback address would be looked for here
        assert link_address(replace(target, zmq="tcp://127.0.0.1:5555")) == here
        assert (
            link_address(replace(target, zmq="tcp://localhost:5555")) == "tcp://localhost:5555"
        )  # no lookup
    finally:
        squatter.close(0)
        ctx.term()


async def test_a_tcp_link_stays_when_the_worker_restarts_at_the_same_endpoint():
    """Without the same-host endpoint, a new incarnation at the same address keeps its link (ZeroMQ
    reconnects it by itself), as before: requests on it are not failed by the record's change."""
    ctx = zmq.asyncio.Context()
    peer = Peer(ctx)
    fwd = Forwarder(heartbeat_s=0.1, heartbeat_timeout_s=0.5)
    try:
        fwd.sync({"w1": WorkerEndpoint("w1", peer.endpoint, incarnation="inc-a")})
        assert await fwd.wait_connected("w1", 5)
        sending = asyncio.create_task(fwd.send("w1", request(fwd), {"X": X}, timeout_s=5))
        identity, got, _ = await asyncio.wait_for(peer.request(), 5)
        link = fwd._links["w1"]
        fwd.sync({"w1": WorkerEndpoint("w1", peer.endpoint, incarnation="inc-b")})
        assert fwd._links["w1"] is link and fwd.address("w1") == peer.endpoint
        await peer.reply(identity, ok_reply(got), [])
        await sending
    finally:
        await fwd.close()
        peer.sock.close(0)
        ctx.term()
