"""Breaker actions against a real etcd: a real worker halves its batches at level 1, a real scheduler rolls a
canary back when the level rises (DESIGN.md 7, 8)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid

import numpy as np
import pytest
from harness import (
    SchedulerProcess,
    TensorClient,
    WorkerProcess,
    load_and_run,
    mlp_reference,
    wait_for,
)

from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2, worker_pb2
from mcpcore import wire
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace

MiB = 1 << 20


def etcd(endpoint: str, op: str, key: str, value: bytes = b"") -> dict | None:
    async def run() -> dict | None:
        async with EtcdStore([endpoint]) as store:
            if op == "put":
                await store.put(key, value)
            elif op == "delete":
                await store.delete(key)
            else:
                kv = await store.get(key)
                return None if kv is None else json.loads(kv.value)
            return None

    return asyncio.run(run())


# --- the worker: level 1 halves the max batch size --------------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    proc = WorkerProcess(
        tmp_path_factory.mktemp("worker"), etcd_endpoint, repo, prefix=prefix, memory_capacity_bytes=256 * MiB
    ).start()
    control = proc.control()
    load_and_run(control, "demo-mlp", "1")
    yield proc, control, Keyspace(prefix)
    proc.stop()


def max_batch(control, model: str = "demo-mlp") -> dict[str, int]:
    stats = control.Stats(worker_pb2.StatsRequest(model=model), timeout=5)
    return {m.version: m.max_batch_size for m in stats.models}


def metric(text: str, name: str, labels: str) -> float:
    found = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_level_1_halves_the_max_batch_size_and_level_0_restores_it(node, repo, etcd_endpoint):
    worker, control, keys = node
    assert max_batch(control) == {"1": 64}
    etcd(
        etcd_endpoint, "put", keys.breaker("demo-mlp"), b'{"level": 1, "reason": "test", "set_by": "pytest"}'
    )
    wait_for(lambda: max_batch(control) == {"1": 32}, what="the max batch size halved")
    assert metric(worker.metrics_text(), "mcp_breaker_level", 'model="demo-mlp"') == 1

    # 64 concurrent one-row requests: all exact, and no batch holds more than 32 of them
    client = TensorClient(worker.endpoints["zmq"])
    try:
        rows = np.random.default_rng(32).random((64, 1, 64), np.float32)
        sent = {client.send("demo-mlp", {"INPUT0": x}, version="1"): x for x in rows}
        for _ in sent:
            msg = client.recv()
            wire.raise_for_status(msg.header)
            expected = mlp_reference(repo, "demo-mlp", "1", sent[msg.header.request_id])
            np.testing.assert_allclose(msg.tensors[0], expected, rtol=1e-5, atol=1e-5)
    finally:
        client.close()
    text = worker.metrics_text()
    labels = 'model="demo-mlp",version="1"'
    batches = metric(text, "mcp_batch_size_count", labels)
    assert metric(text, "mcp_batch_size_sum", labels) == 64
    assert metric(text, "mcp_batch_size_bucket", 'le="32.0",' + labels) == batches  # every batch <= 32

    # a version loaded while the breaker is up starts halved; the load report carries the level
    load_and_run(control, "demo-mlp", "2")
    assert max_batch(control) == {"1": 32, "2": 32}
    report = wait_for(
        lambda: (
            (r := etcd(etcd_endpoint, "get", keys.worker_load(worker.worker_id)))
            and "demo-mlp/2" in r["models"]
            and r
        ),
        what="a load report with version 2",
    )
    assert {report["models"][k]["breaker_level"] for k in ("demo-mlp/1", "demo-mlp/2")} == {1}
    assert report["models"]["demo-mlp/2"]["max_batch_size"] == 32

    etcd(etcd_endpoint, "put", keys.breaker("demo-mlp"), b'{"level": 0}')
    wait_for(lambda: max_batch(control) == {"1": 64, "2": 64}, what="the max batch size restored")
    assert metric(worker.metrics_text(), "mcp_breaker_level", 'model="demo-mlp"') == 0
    control.Unload(worker_pb2.UnloadRequest(model="demo-mlp", version="2"), timeout=30)


def test_an_invalid_breaker_changes_nothing_and_is_counted(node, etcd_endpoint):
    worker, control, keys = node
    key = keys.breaker("demo-mlp")
    etcd(etcd_endpoint, "put", key, b'{"level": 1}')
    wait_for(lambda: max_batch(control) == {"1": 32}, what="level 1 in force")
    before = metric(worker.metrics_text(), "mcp_config_rejected_total", 'key="breaker"')
    for n, bad in enumerate([b'{"level": 9}', b"not json", b'{"levle": 0}', b"[" * 100_000], start=1):
        etcd(etcd_endpoint, "put", key, bad)
        wait_for(
            lambda n=n: (
                metric(worker.metrics_text(), "mcp_config_rejected_total", 'key="breaker"') == before + n
            ),
            what=f"rejection {n} counted",
        )
        assert max_batch(control) == {"1": 32}  # the last good level stays in force
    etcd(etcd_endpoint, "delete", key)  # no document: closed
    wait_for(lambda: max_batch(control) == {"1": 64}, what="the breaker closed by deleting its key")


def test_a_forced_level_ends_at_its_until(node, etcd_endpoint):
    _, control, keys = node
    doc = {"level": 1, "reason": "forced", "set_by": "operator", "until": time.time() + 1.5}
    etcd(etcd_endpoint, "put", keys.breaker("demo-mlp"), json.dumps(doc).encode())
    wait_for(lambda: max_batch(control) == {"1": 32}, what="the forced level in force")
    wait_for(lambda: max_batch(control) == {"1": 64}, timeout_s=15, what="the forced level expired")
    etcd(etcd_endpoint, "delete", keys.breaker("demo-mlp"))


# --- the scheduler: a canary is rolled back when the level rises -----------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    tmp = tmp_path_factory.mktemp("cluster")
    worker = WorkerProcess(tmp, etcd_endpoint, repo, prefix=prefix, memory_capacity_bytes=256 * MiB).start()
    scheduler = SchedulerProcess(tmp, etcd_endpoint, prefix=prefix, leader_ttl_s=2).start()
    yield Keyspace(prefix), scheduler
    scheduler.stop()
    worker.stop()


def test_a_canary_is_rolled_back_when_the_breaker_rises(cluster, etcd_endpoint):
    keys, scheduler = cluster
    stub = control_pb2_grpc.ModelControlStub(scheduler.channel())
    spec = model_pb2.ModelSpec(model="demo-mlp", versions=["1"], replicas=1)
    stub.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
    canary = {"stable": "1", "canary": "2", "canary_percent": 10}
    etcd(etcd_endpoint, "put", keys.model_traffic("demo-mlp"), json.dumps(canary).encode())
    wait_for(
        lambda: etcd(etcd_endpoint, "get", keys.model_routing("demo-mlp")) == canary,
        timeout_s=60,
        what="the canary in force",
    )

    etcd(
        etcd_endpoint,
        "put",
        keys.breaker("demo-mlp"),
        b'{"level": 2, "reason": "errors", "set_by": "health"}',
    )
    wait_for(
        lambda: etcd(etcd_endpoint, "get", keys.model_traffic("demo-mlp")) == {"stable": "1"},
        timeout_s=30,
        what="the canary rolled back in the traffic key",
    )
    wait_for(
        lambda: etcd(etcd_endpoint, "get", keys.model_routing("demo-mlp")) == {"stable": "1"},
        timeout_s=30,
        what="routing following the rollback",
    )

    # closed again, an operator re-enables the canary and it stays
    etcd(etcd_endpoint, "put", keys.breaker("demo-mlp"), b'{"level": 0}')
    etcd(etcd_endpoint, "put", keys.model_traffic("demo-mlp"), json.dumps(canary).encode())
    wait_for(
        lambda: etcd(etcd_endpoint, "get", keys.model_routing("demo-mlp")) == canary,
        timeout_s=60,
        what="the canary re-enabled",
    )
    assert etcd(etcd_endpoint, "get", keys.model_traffic("demo-mlp")) == canary
    stub.UnloadModel(control_pb2.UnloadModelRequest(model="demo-mlp"), timeout=60)
