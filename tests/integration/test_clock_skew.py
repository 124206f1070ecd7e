"""Liveness without cross-host clocks: workers whose wall clocks are a minute off flap nothing.

Each worker runs under Debian's ``faketime`` (libfaketime), one 60 s ahead of this host and one 60 s behind;
their monotonic clocks are left alone (``FAKETIME_DONT_FAKE_MONOTONIC``), as on a host whose NTP is off.
Their load reports carry their own wall-clock times; health must judge them by when the reports arrive.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path

import grpc
from harness import (
    HealthProcess,
    RouterProcess,
    SchedulerProcess,
    WorkerProcess,
    etcd_get,
    metric,
    wait_for,
)
from meshload import CheckedLoad, router_channel

from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, health_pb2, health_pb2_grpc, model_pb2
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace


def _skewed(worker: WorkerProcess, offset: str) -> WorkerProcess:
    """The worker itself under libfaketime (LD_PRELOAD), not under the ``faketime`` wrapper: the wrapper
    forks, so stopping it left the worker running, an orphan, after every run."""
    assert shutil.which("faketime"), "faketime is missing: `make setup` installs Debian's faketime"
    library = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"), None)
    assert library is not None, "libfaketime.so.1 is missing: `make setup` installs Debian's faketime"
    worker.env = {
        **worker.env,
        "LD_PRELOAD": str(library),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    return worker


def test_workers_a_minute_ahead_and_behind_flap_nothing(tmp_path, etcd_endpoint, repo):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    keys = Keyspace(prefix)
    flags = {"prefix": prefix, "lease_ttl_s": 2, "heartbeat_interval_s": 0.3}
    workers = [
        _skewed(WorkerProcess(tmp_path, etcd_endpoint, repo, **flags), offset).start()
        for offset in ("+60s", "-60s")
    ]
    scheduler = SchedulerProcess(tmp_path, etcd_endpoint, prefix=prefix, reconcile_interval_s=0.3).start()
    health = HealthProcess(
        tmp_path, etcd_endpoint, prefix=prefix, check_interval_s=0.2, report_timeout_s=2, leader_ttl_s=2
    ).start()
    router = RouterProcess(tmp_path, etcd_endpoint, prefix=prefix, scheduler="").start()
    procs = [*workers, scheduler, health, router]
    try:
        control = control_pb2_grpc.ModelControlStub(scheduler.channel())
        spec = model_pb2.ModelSpec(model="demo-mlp", versions=["1"], replicas=2)
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
        record_keys = [keys.replica("demo-mlp", "1", w.worker_id) for w in workers]
        wait_for(
            lambda: all((etcd_get(etcd_endpoint, k) or {}).get("state") == "RUNNING" for k in record_keys),
            what="both replicas RUNNING",
        )
        for w, skew in zip(workers, (60, -60), strict=True):  # the skew took: reports carry it
            beat = etcd_get(etcd_endpoint, keys.worker_load(w.worker_id))["last_beat"]
            assert abs(beat - time.time() - skew) < 5, (w.worker_id, beat - time.time())
        # the router routes it too (its snapshot follows etcd a moment later): load before that is refused
        ready = kserve_grpc.GRPCInferenceServiceStub(router.channel()).ModelReady
        request = kserve_pb.ModelReadyRequest(name="demo-mlp", version="1")
        wait_for(lambda: ready(request, timeout=5).ready, what="demo-mlp routed")
        revisions = {k: _mod_revision(etcd_endpoint, k) for k in record_keys}
        channel = router_channel([router.endpoints["grpc"]])
        with CheckedLoad(channel, "demo-mlp", repo, clients=2) as load:
            load.wait_ok(20)
            deadline = time.monotonic() + 3 * 2.0  # three report timeouts: long enough to misjudge
            while time.monotonic() < deadline:
                # any rewrite of a record (an ERROR mark, a re-sync after one) changes its revision
                assert {k: _mod_revision(etcd_endpoint, k) for k in record_keys} == revisions
                time.sleep(0.1)  # the sampling period of this check, not a synchronisation
        channel.close()
        assert (load.result.failures, load.result.wrong) == ([], [])
        report = health_pb2_grpc.HealthStub(grpc.insecure_channel(health.endpoints["grpc"])).ClusterHealth(
            health_pb2.ClusterHealthRequest(), timeout=5
        )
        ages = {w.worker_id: (w.alive, w.heartbeat_age_ms) for w in report.workers}
        assert {w.worker_id for w in workers} == set(ages)
        assert all(alive and age < 2000 for alive, age in ages.values()), ages
        text = health.metrics_text()
        for w in workers:  # the age health exports is measured on its own clock: under a second or so
            assert metric(text, "mcp_heartbeat_age_seconds", worker=w.worker_id) < 2.0
    finally:
        for proc in reversed(procs):
            proc.stop()


def _mod_revision(endpoint: str, key: str) -> int:
    async def read() -> int:
        async with EtcdStore([endpoint]) as store:
            kv = await store.get(key)
            return 0 if kv is None else kv.mod_revision

    return asyncio.run(read())
