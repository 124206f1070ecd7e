"""Coalesced tensor messages (``KIND_BATCH``) against a real worker process, straight over ZeroMQ.

A router puts the requests it has for one worker in one loop iteration into one message; the worker
answers each on its own terms (status, retry flag, executions, cancel), coalescing its replies in turn.
Single messages, as older routers and the SDK send them, stay valid and are answered with single ones.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import numpy as np
import pytest
import zmq
from harness import TensorClient, WorkerProcess, etcd_get, make_demo_repository, mlp_reference, serving_worker
from harness import metric as metric_in

from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import InvalidArgument, Unavailable
from mcpcore.keys import Keyspace

CODE = {cls: int(cls.code) for cls in (InvalidArgument, Unavailable)}
ROWS = [np.full((1, 64), i / 10, np.float32) for i in range(6)]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_demo_repository(tmp_path_factory.mktemp("repo") / "models")


@pytest.fixture(scope="module")
def worker(tmp_path_factory, etcd_endpoint, repo):
    models = ("demo-mlp", "demo-slow", "demo-stream")
    with serving_worker(tmp_path_factory.mktemp("worker"), etcd_endpoint, repo, models, exec_slots=1) as proc:
        yield proc


@pytest.fixture
def client(worker):
    with TensorClient(worker.endpoints["zmq"]) as c:
        yield c


@dataclass
class Reply:
    header: tensor_pb2.TensorHeader
    tensors: tuple[np.ndarray, ...]
    coalesced: bool  # it came in a KIND_BATCH message


def request(model: str, inputs: dict[str, np.ndarray], **fields: object) -> tuple[str, list]:  # type: ignore[type-arg]
    rid = f"c-{uuid.uuid4().hex[:8]}"
    header = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_REQUEST, request_id=rid, model=model, **fields)
    return rid, wire.encode(header, inputs)


def send_coalesced(client: TensorClient, messages: list[list]) -> None:  # type: ignore[type-arg]
    [(count, frames)] = wire.coalesce(messages)  # one message, as a router sends it
    assert count == len(messages) > 1
    client.sock.send_multipart(frames, copy=False)


def receive(client: TensorClient) -> list[Reply]:
    """One message's replies: each of a coalesced one, taken apart."""
    frames = client.sock.recv_multipart()
    header = wire.parse_header(frames[0])
    if header.kind != wire.KIND_BATCH:
        return [Reply(header, wire.tensors_of(header, frames[1:]), False)]
    return [Reply(h, wire.tensors_of(h, t), True) for h, t in wire.uncoalesce(header, frames[1:])]


def until_ended(client: TensorClient, rids: set[str]) -> dict[str, list[Reply]]:
    """Every reply until each of ``rids`` got its last (a reply without FLAG_PARTIAL)."""
    got: dict[str, list[Reply]] = {}
    open_ = set(rids)
    while open_:
        for reply in receive(client):
            rid = reply.header.request_id
            assert rid in rids, f"a reply to {rid!r}, which nobody sent"
            got.setdefault(rid, []).append(reply)
            if not reply.header.flags & wire.FLAG_PARTIAL:
                assert rid in open_, f"{rid} answered after its last reply"
                open_.discard(rid)
    return got


def metric(worker: WorkerProcess, name: str, **labels: str) -> float:
    return metric_in(worker.metrics_text(), name, **labels)


def test_each_coalesced_request_is_answered_on_its_own_terms(worker, client, repo):
    """Six good requests, a bad one, one for a model not held here and a decoupled one in one message."""
    executed = metric(worker, "mcp_worker_executions_total", model="demo-mlp")
    coalesced = metric(worker, "mcp_worker_zmq_messages_total", kind="coalesced")
    good = [request("demo-mlp", {"INPUT0": x}) for x in ROWS]
    bad = request("demo-mlp", {"INPUT0": np.zeros((1, 3), np.float32)})
    absent = request("not-here", {"INPUT0": ROWS[0]})
    stream = request("demo-stream", {"N": np.array([3], np.int32)})
    send_coalesced(client, [m for _, m in good] + [bad[1], absent[1], stream[1]])
    got = until_ended(client, {rid for rid, _ in [*good, bad, absent, stream]})

    for (rid, _), x in zip(good, ROWS, strict=True):
        [reply] = got[rid]
        assert reply.header.status_code == 0, reply.header.status_message
        np.testing.assert_allclose(
            reply.tensors[0], mlp_reference(repo, "demo-mlp", "1", x), rtol=1e-5, atol=1e-6
        )
    assert any(reply.coalesced for rid, _ in good for reply in got[rid])  # replies went back together
    [refused] = got[bad[0]]
    assert refused.header.status_code == CODE[InvalidArgument] and "INPUT0" in refused.header.status_message
    assert not refused.header.flags & wire.FLAG_RETRYABLE  # bad input is not another worker's to try
    [elsewhere] = got[absent[0]]
    assert elsewhere.header.status_code == CODE[Unavailable]
    assert elsewhere.header.flags & wire.FLAG_RETRYABLE  # not started: another worker may take it
    answers = got[stream[0]]  # a decoupled model's answers still stream, the last one without the flag
    assert [int(r.tensors[0][0]) for r in answers[:-1]] == [0, 1, 2]
    assert answers[-1].header.status_code == 0 and not answers[-1].header.flags & wire.FLAG_PARTIAL
    assert metric(worker, "mcp_worker_executions_total", model="demo-mlp") == executed + 6
    assert metric(worker, "mcp_worker_zmq_messages_total", kind="coalesced") == coalesced + 1


def test_an_older_senders_single_messages_get_single_replies(worker, client, repo):
    """A sender that knows nothing of coalescing (an older router, the SDK) on the same socket as a
    coalesced message: its requests are served and answered with single messages."""
    singles = [client.send("demo-mlp", {"INPUT0": x}) for x in ROWS[:3]]
    batch = [request("demo-mlp", {"INPUT0": x}) for x in ROWS[3:]]
    send_coalesced(client, [m for _, m in batch])
    got = until_ended(client, {*singles, *(rid for rid, _ in batch)})
    for rid, x in zip(singles, ROWS[:3], strict=True):
        [reply] = got[rid]
        assert not reply.coalesced and reply.header.status_code == 0
        np.testing.assert_allclose(
            reply.tensors[0], mlp_reference(repo, "demo-mlp", "1", x), rtol=1e-5, atol=1e-6
        )
    assert all(got[rid][0].header.status_code == 0 for rid, _ in batch)


def test_a_queued_coalesced_request_can_be_cancelled_and_never_runs(worker, client):
    """One slot, demo-slow runs 8 rows per 50 ms: the last of 24 waits >= 100 ms; its cancel comes at once."""
    executed = metric(worker, "mcp_worker_executions_total", model="demo-slow")
    batch = [request("demo-slow", {"INPUT0": ROWS[0]}) for _ in range(24)]
    send_coalesced(client, [m for _, m in batch])
    last = batch[-1][0]
    cancel = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_CANCEL, request_id=last, model="demo-slow")
    client.sock.send_multipart([cancel.SerializeToString()])
    got = until_ended(client, {rid for rid, _ in batch})
    [cancelled] = got[last]
    assert cancelled.header.status_code == CODE[Unavailable]
    assert "cancelled" in cancelled.header.status_message
    assert all(got[rid][0].header.status_code == 0 for rid, _ in batch[:-1])
    assert metric(worker, "mcp_worker_executions_total", model="demo-slow") == executed + 23


def test_a_coalesced_message_that_does_not_add_up_is_refused_per_request(worker, client):
    a, b = request("demo-mlp", {"INPUT0": ROWS[0]}), request("demo-mlp", {"INPUT0": ROWS[1]})
    [(_, frames)] = wire.coalesce([a[1], b[1]])
    client.sock.send_multipart(frames[:-1], copy=False)  # one tensor frame short
    got = until_ended(client, {a[0], b[0]})
    for rid in (a[0], b[0]):
        [reply] = got[rid]
        assert reply.header.status_code == CODE[InvalidArgument]
        assert "2 tensor(s) but 1 tensor frame(s)" in reply.header.status_message
    assert client.infer("demo-mlp", {"INPUT0": ROWS[0]}).header.status_code == 0  # it goes on


def test_a_worker_advertises_that_it_takes_coalesced_messages(worker, etcd_endpoint):
    record = etcd_get(etcd_endpoint, Keyspace(worker.prefix).worker(worker.worker_id))
    assert record is not None and wire.FEATURE_BATCH in record["zmq_features"]


def test_replies_bound_for_a_gone_peer_do_not_stop_the_worker(worker, repo):
    """A sender that leaves with coalesced requests in flight: the replies are dropped, the rest served."""
    leaving = TensorClient(worker.endpoints["zmq"])
    send_coalesced(leaving, [request("demo-slow", {"INPUT0": ROWS[0]})[1] for _ in range(8)])
    leaving.sock.close(linger=0)
    leaving.ctx.term()
    other = TensorClient(worker.endpoints["zmq"])
    other.sock.setsockopt(zmq.RCVTIMEO, 15000)
    try:
        reply = other.infer("demo-mlp", {"INPUT0": ROWS[2]})
        np.testing.assert_allclose(
            reply.tensors[0], mlp_reference(repo, "demo-mlp", "1", ROWS[2]), rtol=1e-5, atol=1e-6
        )
    finally:
        other.close()


def test_single_requests_that_take_coalesced_replies_get_them(worker, client, repo):
    """Routers flag every request FLAG_TAKES_COALESCED: the replies of one batch go back together."""
    rids = [client.send("demo-mlp", {"INPUT0": x}, flags=wire.FLAG_TAKES_COALESCED) for x in ROWS]
    got = until_ended(client, set(rids))
    for rid, x in zip(rids, ROWS, strict=True):
        [reply] = got[rid]
        np.testing.assert_allclose(
            reply.tensors[0], mlp_reference(repo, "demo-mlp", "1", x), rtol=1e-5, atol=1e-6
        )
    assert any(got[rid][0].coalesced for rid in rids)  # sent one by one, batched together, answered together


@pytest.fixture(scope="module")
def small(tmp_path_factory, etcd_endpoint, repo):
    """A worker with room for 4 requests: a ticket it never gets back shows at once."""
    tmp = tmp_path_factory.mktemp("small")
    with serving_worker(
        tmp, etcd_endpoint, repo, ("demo-mlp",), exec_slots=1, max_in_flight_requests=4
    ) as proc:
        yield proc


def test_a_request_id_already_in_flight_is_refused_and_costs_no_ticket(small):
    client = TensorClient(small.endpoints["zmq"])
    try:
        for _ in range(6):  # more rounds than the worker has tickets: a leak would refuse the last ones
            rid, first = request("demo-mlp", {"INPUT0": ROWS[0]})
            again = wire.encode(wire.parse_header(first[0]), {"INPUT0": ROWS[1]})  # the same id
            send_coalesced(client, [first, again])
            replies: list[Reply] = []
            while len(replies) < 2:
                replies += receive(client)
            codes = sorted(r.header.status_code for r in replies)
            assert [r.header.request_id for r in replies] == [rid, rid]
            assert codes == [0, CODE[InvalidArgument]]
            refused = next(r for r in replies if r.header.status_code)
            assert "already in flight" in refused.header.status_message
        rids = [client.send("demo-mlp", {"INPUT0": x}) for x in ROWS[:4]]  # all 4 tickets are free
        got = until_ended(client, set(rids))
        assert all(got[rid][0].header.status_code == 0 for rid in rids)
    finally:
        client.close()


async def test_stopping_ends_a_wait_for_idle_and_sends_the_replies_made(tmp_path):
    """A request held by its model when the server stops: a wait for idle ends then (not at its
    timeout), and an answered request's coalesced reply still goes."""
    import zmq.asyncio  # noqa: PLC0415

    from mcp_worker.tensor_server.server import TensorServer  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    taken = asyncio.Event()
    one = np.ones(1, np.float32)

    def start(msg: wire.Message, partial, done):  # type: ignore[no-untyped-def]
        if msg.header.request_id == "quick":
            loop.call_soon(done, ("1", {"Y": one}))
        else:
            taken.set()  # its model never answers
        return lambda: None

    srv = TensorServer(f"ipc://{tmp_path}/t.sock", start)
    await srv.start()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(srv.endpoint)
    try:
        frames = [wire.encode(tensor_pb2.TensorHeader(request_id=rid, model="m"), {"X": one})
                  for rid in ("slow", "quick")]  # fmt: skip
        [(_, message)] = wire.coalesce(frames)
        await sock.send_multipart(message, copy=False)
        await asyncio.wait_for(taken.wait(), 5)
        idle = asyncio.create_task(srv.wait_idle(30))
        await srv.stop()
        async with asyncio.timeout(5):
            assert await idle  # at once, not after 30 s
            reply = wire.parse_header((await sock.recv_multipart())[0])
        assert reply.request_id == "quick" and reply.status_code == 0
    finally:
        sock.close(linger=0)
        ctx.term()
