"""A real worker's bounds, straight over ZeroMQ: admission and its fair share, deadlines, reply limits, and
the execution counters that prove "at most once".

One worker process with one execution slot, room for 8 requests and 64 KiB tensor frames, so each bound
is reached on purpose; every check reads what the worker answered and what its /metrics say.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import yaml
from harness import TensorClient, WorkerProcess, make_demo_repository, serving_worker
from harness import metric as metric_in

from mcpapi.v2 import tensor_pb2
from mcpcore import wire
from mcpcore.errors import DeadlineExceeded, Unavailable

ROW = np.zeros((1, 64), np.float32)
CODE = {cls: int(cls.code) for cls in (Unavailable, DeadlineExceeded)}


def _edit(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    config = yaml.safe_load(path.read_text())
    change(config)
    path.write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = make_demo_repository(tmp_path_factory.mktemp("repo") / "models")
    # short-queue: demo-slow whose requests may wait 20 ms in its queue (its policy)
    shutil.copytree(repo / "demo-slow", repo / "short-queue")
    _edit(
        repo / "short-queue/1/model.yaml",
        lambda c: c["dynamic_batching"].update(default_queue_timeout_us=20_000),
    )
    # wide: 64 -> 4096, so 8 rows make a 128 KiB output from a 2 KiB input
    (repo / "wide/1").mkdir(parents=True)
    rng = np.random.default_rng(0)
    safetensors.numpy.save_file({"w": rng.random((64, 4096), dtype=np.float32)}, str(repo / "wide/1/w.st"))
    wide = {
        "backend": "numpy", "max_batch_size": 8, "weights": "w.st",
        "inputs": [{"name": "INPUT0", "dtype": "FP32", "shape": [-1, 64]}],
        "outputs": [{"name": "OUTPUT0", "dtype": "FP32", "shape": [-1, 4096]}],
        "layers": [{"op": "dense", "in": 64, "out": 4096, "weight": "w"}],
    }  # fmt: skip
    (repo / "wide/1/model.yaml").write_text(yaml.safe_dump(wide))
    return repo


@pytest.fixture(scope="module")
def worker(tmp_path_factory, etcd_endpoint, repo):
    tmp = tmp_path_factory.mktemp("worker")
    models = ("demo-slow", "demo-mlp", "short-queue", "wide", "demo-stream")
    with serving_worker(
        tmp, etcd_endpoint, repo, models, exec_slots=1, max_in_flight_requests=8, max_tensor_bytes=64 << 10,
        execution_log=tmp / "executions",
    ) as proc:  # fmt: skip
        yield proc


@pytest.fixture
def client(worker):
    with TensorClient(worker.endpoints["zmq"]) as c:
        yield c


def metric(worker: WorkerProcess, name: str, **labels: str) -> float:
    return metric_in(worker.metrics_text(), name, **labels)


def replies(client: TensorClient, n: int) -> list:  # type: ignore[type-arg]
    return [client.recv().header for _ in range(n)]


def test_a_full_worker_refuses_at_once_and_says_the_request_did_not_start(worker, client):
    refused_before = metric(worker, "mcp_worker_admission_refused_total")
    for _ in range(20):  # one slot, 50 ms a batch of 8: far more than it can hold
        client.send("demo-slow", {"INPUT0": ROW})
    got = replies(client, 20)
    refused = [h for h in got if h.status_code]
    assert len(got) - len(refused) == 8  # what it admitted ran; nothing was lost
    for h in refused:
        assert h.status_code == CODE[Unavailable] and h.flags & wire.FLAG_RETRYABLE
        assert h.status_message.startswith("exceeds maximum queue size")
    first_ok = next(i for i, h in enumerate(got) if not h.status_code)
    assert all(h.status_code for h in got[:first_ok]) and first_ok >= 10  # refusals came before any work
    assert metric(worker, "mcp_worker_admission_refused_total") - refused_before == len(refused)


def test_a_model_flooding_the_worker_leaves_another_its_share(worker):
    """demo-slow is offered far more than the worker holds; demo-mlp, asking little, is still served."""
    stop = threading.Event()

    def flood() -> None:
        hog = TensorClient(worker.endpoints["zmq"])
        out = 0
        while not stop.is_set():
            while out < 24:
                hog.send("demo-slow", {"INPUT0": ROW})
                out += 1
            hog.recv()
            out -= 1
        for _ in range(out):
            hog.recv()
        hog.close()

    thread = threading.Thread(target=flood)
    thread.start()
    light = TensorClient(worker.endpoints["zmq"])
    try:
        time.sleep(0.2)  # the flood's own ramp-up: it fills the worker first (not a synchronisation)
        for _ in range(30):  # a modest, steady demand: one request every 30 ms, never resent
            light.send("demo-mlp", {"INPUT0": ROW})
            time.sleep(0.03)  # the light client's pace, part of the scenario
        heads = [light.recv().header for _ in range(30)]
        outcomes = [h.status_code for h in heads]
    finally:
        stop.set()
        thread.join(30)
        light.close()
    served = outcomes.count(0) / len(outcomes)
    assert served >= 0.8, outcomes  # the hog is refused above its share; the light model's room stays


def test_a_request_out_of_time_is_dropped_before_it_runs(worker, client):
    dropped_before = metric(worker, "mcp_worker_deadline_dropped_total", model="demo-slow")
    ran_before = metric(worker, "mcp_worker_executions_total", model="demo-slow")
    client.send("demo-slow", {"INPUT0": np.zeros((8, 64), np.float32)})  # the one slot: busy for 50 ms
    late = client.send("demo-slow", {"INPUT0": ROW}, timeout_us=10_000)  # 10 ms left: it cannot run in time
    got = {h.request_id: h for h in replies(client, 2)}
    assert got[late].status_code == CODE[DeadlineExceeded] and "it did not run" in got[late].status_message
    assert got[late].flags & wire.FLAG_RETRYABLE
    assert metric(worker, "mcp_worker_deadline_dropped_total", model="demo-slow") - dropped_before == 1
    assert (
        metric(worker, "mcp_worker_executions_total", model="demo-slow") - ran_before == 1
    )  # only the first


def test_the_models_queue_timeout_holds_when_the_deadline_is_longer(worker, client):
    """min(policy, deadline): short-queue's 20 ms, though the request has 30 s."""
    client.send("demo-slow", {"INPUT0": np.zeros((8, 64), np.float32)})  # the slot: busy for 50 ms
    waited = client.send("short-queue", {"INPUT0": ROW}, timeout_us=30_000_000)
    got = {h.request_id: h for h in replies(client, 2)}
    assert got[waited].status_code == CODE[DeadlineExceeded]
    assert "over its 20 ms timeout" in got[waited].status_message


def test_a_reply_over_the_limits_is_never_sent(worker, client):
    with pytest.raises(Exception, match="output OUTPUT0 of model wide is 131072 bytes, over the 65536-byte"):
        client.infer("wide", {"INPUT0": np.zeros((8, 64), np.float32)})
    client.send("wide", {"INPUT0": np.zeros((8, 64), np.float32)})
    assert not client.recv().header.flags & wire.FLAG_RETRYABLE  # it ran: not to be sent again
    assert client.infer("wide", {"INPUT0": ROW}).tensors[0].shape == (1, 4096)  # one row fits


def test_a_request_run_twice_is_counted_and_journaled(worker, client, tmp_path_factory):
    before = metric(worker, "mcp_worker_duplicate_executions_total", model="demo-mlp")
    rid = f"again-{uuid.uuid4().hex[:6]}"
    for _ in range(2):  # a sender that resends an id (a router never does unless it may)
        client.infer("demo-mlp", {"INPUT0": ROW}, request_id=rid)
    assert metric(worker, "mcp_worker_duplicate_executions_total", model="demo-mlp") - before == 1
    journal = (worker.tmp / "executions").read_text().splitlines()
    assert journal.count(f"demo-mlp {rid}") == 2


def _cancel(client: TensorClient, rid: str, model: str) -> None:
    cancel = tensor_pb2.TensorHeader(kind=tensor_pb2.KIND_CANCEL, request_id=rid, model=model)
    client.sock.send_multipart([cancel.SerializeToString()])


def test_a_cancel_drops_a_queued_request_and_stops_a_stream(worker, client):
    """One execution slot: a long stream holds it, a request queues behind it. Cancelling the queued one
    answers it at once and it never runs; cancelling the stream stops its answers and frees the slot."""
    before = metric(worker, "mcp_worker_executions_total", model="demo-mlp")
    stream = client.send(
        "demo-stream", {"N": np.array([500], np.int32)}, parameters={"delay_ms": "10"}
    )  # 5 s of answers if nothing stops it
    first = client.recv().header
    assert first.request_id == stream and first.flags & wire.FLAG_PARTIAL
    queued = client.send("demo-mlp", {"INPUT0": ROW})
    _cancel(client, queued, "demo-mlp")
    answers, last = 1, None
    while last is None:
        header = client.recv().header
        if header.request_id == stream:
            answers += 1
            if answers == 5:
                _cancel(client, stream, "demo-stream")
            if not header.flags & wire.FLAG_PARTIAL:
                last = header
        else:
            assert header.request_id == queued and "cancelled" in header.status_message
    assert last.status_code == CODE[Unavailable] and "cancelled" in last.status_message
    assert answers < 50  # it stopped long before its 500 answers
    reply = client.infer("demo-mlp", {"INPUT0": ROW})  # the slot is free again
    assert not reply.header.status_code
    assert (
        metric(worker, "mcp_worker_executions_total", model="demo-mlp") == before + 1
    )  # never the queued one
