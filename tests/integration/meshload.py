"""A checked load and a small mesh for fault tests: routers, workers, a scheduler and a health service.

``CheckedLoad`` runs closed-loop clients on threads through one gRPC channel to one or more routers (the
way a client with several routers connects: round robin, health-checked), each request carrying inputs of
its own and each answer checked against the reference computed from the weights file: an answer that
belongs to another request is a failure, never a pass. ``Mesh`` starts the processes a ``make up``-style
cluster has, on a private etcd the tests may freeze, kill and restart, with an execution journal per
worker so that requests run twice are counted across workers, even ones killed with ``kill -9``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from harness import (
    HealthProcess,
    RouterProcess,
    SchedulerProcess,
    WorkerProcess,
    etcd_get,
    metric,
    mlp_reference,
    wait_for,
)

from mcpapi.v2 import control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc, model_pb2, worker_pb2
from mcpclient.localetcd import EtcdServer
from mcpcore import dtypes
from mcpcore.keys import Keyspace

MAY_HAVE_STARTED = "may have started"
#: Links time out before the workers' 2 s leases; a SIGTERM gives clients half a second's notice.
ROUTER_FLAGS = {"scheduler": "", "link_heartbeat_s": 0.3, "link_timeout_s": 1.2, "shutdown_delay_s": 0.5}


def router_channel(addresses: list[str]) -> grpc.Channel:
    """One channel over several routers: round robin over those that report SERVING (grpc.health.v1)."""
    config = {"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": ""}}
    return grpc.insecure_channel(
        "ipv4:" + ",".join(addresses),
        options=[("grpc.service_config", json.dumps(config)), ("grpc.enable_retries", 1)],
    )


def tensor(x: np.ndarray) -> inference_pb2.Tensor:
    return inference_pb2.Tensor(
        name="INPUT0", dtype=dtypes.wire_value("FP32"), shape=list(x.shape), data=x.tobytes()
    )


@dataclass
class LoadResult:
    ok: int = 0
    failures: list[str] = field(default_factory=list)  # "CODE: details"
    wrong: list[str] = field(default_factory=list)  # answers that were not the request's own
    counts: list[tuple[str, int]] = field(default_factory=list)  # demo-stateful: (worker, counter)

    def not_may_have_started(self) -> list[str]:
        return [f for f in self.failures if MAY_HAVE_STARTED not in f]


class CheckedLoad:
    """``with CheckedLoad(channel, "demo-mlp", repo, clients=4) as load: ...``; then ``load.result``."""

    def __init__(self, channel: grpc.Channel, model: str, repo: Path, *, clients: int = 4) -> None:
        self._infer = inference_pb2_grpc.InferenceStub(channel).Infer
        self._model = model
        self.result = LoadResult()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._inputs = []
        for c in range(clients):  # distinct inputs per client: a swapped answer cannot match
            xs = [np.random.default_rng(c * 100 + k).random((1, 64), dtype=np.float32) for k in range(8)]
            refs = [mlp_reference(repo, "demo-mlp", "1", x) for x in xs] if model != "demo-stateful" else []
            self._inputs.append((xs, refs))
        self._threads = [threading.Thread(target=self._run, args=(c,), daemon=True) for c in range(clients)]

    def __enter__(self) -> CheckedLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> LoadResult:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        return self.result

    def wait_ok(self, more: int, timeout_s: float = 30.0) -> None:
        """Wait until ``more`` further requests succeeded (traffic flows)."""
        target = self.result.ok + more
        wait_for(lambda: self.result.ok >= target, timeout_s, what=f"{more} more answers from {self._model}")

    def _run(self, c: int) -> None:
        xs, refs = self._inputs[c]
        n = 0
        while not self._stop.is_set():
            k = n % len(xs)
            n += 1
            request = inference_pb2.InferRequest(
                model=self._model, version="1", routing_key=f"c{c}-{n}", inputs=[tensor(xs[k])],
                request_id=str(n),  # every client counts from 1: ids repeat across clients, as in life
            )  # fmt: skip
            try:
                reply = self._infer(request, timeout=20)
            except grpc.RpcError as err:
                with self._lock:
                    self.result.failures.append(f"{err.code().name}: {err.details()}")
                continue
            out = reply.outputs[0]
            got = np.frombuffer(out.data, np.float32).reshape(tuple(out.shape))
            with self._lock:
                if reply.request_id != str(n):
                    self.result.wrong.append(f"client {c}: sent id {n}, got {reply.request_id}")
                elif refs and not np.allclose(got, refs[k], rtol=1e-5, atol=1e-5):
                    self.result.wrong.append(f"client {c} request {n}: another request's tensors")
                else:
                    self.result.ok += 1
                    if not refs:
                        self.result.counts.append((reply.worker_id, int(got[0, 0])))


class Mesh:
    """The processes of a local cluster on a private etcd, with names the fault tests act on."""

    def __init__(self, tmp: Path, repo: Path, *, workers: int = 3, routers: int = 2) -> None:
        self.tmp, self.repo = tmp, repo
        self.etcd = EtcdServer(tmp / "etcd")
        self.prefix = f"/m{uuid.uuid4().hex[:6]}/mcp"
        self.keys = Keyspace(self.prefix)
        self.etcd.start()
        self.workers: dict[str, WorkerProcess] = {}
        for _ in range(workers):
            self.add_worker()
        self.scheduler = self._start(SchedulerProcess, reconcile_interval_s=0.3, leader_ttl_s=2)
        self.health = self._start(HealthProcess, check_interval_s=0.2, leader_ttl_s=2, report_timeout_s=3)
        self.routers = [self._start(RouterProcess, **ROUTER_FLAGS) for _ in range(routers)]
        self.control = control_pb2_grpc.ModelControlStub(self.scheduler.channel())
        self._counted: dict[str, float] = {}

    def _start(self, cls: Any, **flags: Any) -> Any:
        return cls(self.tmp, self.etcd.endpoint, prefix=self.prefix, **flags).start()

    def add_worker(self, worker_id: str | None = None) -> WorkerProcess:
        worker_id = worker_id or f"w-{uuid.uuid4().hex[:6]}"
        worker = WorkerProcess(
            self.tmp, self.etcd.endpoint, self.repo, prefix=self.prefix, worker_id=worker_id,
            lease_ttl_s=2, heartbeat_interval_s=0.3, zmq_heartbeat_s=0.3, zmq_heartbeat_timeout_s=1.2,
            execution_log=self.tmp / f"{worker_id}.executions", drain_timeout_s=5,
        ).start()  # fmt: skip
        self.workers[worker_id] = worker
        return worker

    def load(self, model: str, replicas: int) -> None:
        spec = model_pb2.ModelSpec(model=model, versions=["1"], replicas=replicas)
        self.control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)

    def channel(self) -> grpc.Channel:
        return router_channel([r.endpoints["grpc"] for r in self.routers])

    def live_workers(self) -> list[WorkerProcess]:
        return [w for w in self.workers.values() if w.proc is not None and w.proc.poll() is None]

    # -- what the records claim, checked against the processes -------------------------------------
    def held(self, worker: WorkerProcess) -> set[tuple[str, str]]:
        """(model, version) RUNNING on the worker, as the worker itself says (its Stats RPC)."""
        stats = worker.control().Stats(worker_pb2.StatsRequest(), timeout=5)
        return {(m.model, m.version) for m in stats.models if model_pb2.ModelState.Name(m.state) == "RUNNING"}

    def consistent(self, wanted: dict[str, int]) -> bool:
        """Every model RUNNING on its replica count, by whole records (idempotency and I/O included) of
        registered workers' current incarnation, and every such record matched by what its worker holds."""
        try:
            running: Counter[str] = Counter()
            for worker in self.live_workers():
                record = etcd_get(self.etcd.endpoint, self.keys.worker(worker.worker_id))
                if record is None or record.get("draining"):
                    continue
                held = self.held(worker)
                for model in wanted:
                    doc = etcd_get(self.etcd.endpoint, self.keys.replica(model, "1", worker.worker_id)) or {}
                    if doc.get("state") != "RUNNING":
                        continue
                    info = doc.get("info", {})
                    if info.get("incarnation") != record.get("incarnation"):
                        return False
                    # whole, even when re-created after a forget: routers decide resends by it
                    if info.get("idempotent") is not (model != "demo-stateful") or "outputs" not in info:
                        return False
                    if (model, "1") not in held:
                        return False  # a record that lies
                    running[model] += 1
            return all(running[m] == n for m, n in wanted.items())
        except grpc.RpcError:
            return False

    def duplicates(self, model: str) -> list[str]:
        """Request ids run more than once, over every worker's journal (killed ones included)."""
        seen: Counter[str] = Counter()
        for journal in self.tmp.glob("*.executions"):
            for line in journal.read_text().splitlines():
                name, _, rid = line.partition(" ")
                if name == model:
                    seen[rid] += 1
        return sorted(rid for rid, n in seen.items() if n > 1)

    def executions(self, model: str) -> int:
        return sum(
            1
            for journal in self.tmp.glob("*.executions")
            for line in journal.read_text().splitlines()
            if line.partition(" ")[0] == model
        )

    def may_have_started_total(self) -> float:
        """``mcp_router_may_have_started_total`` over every router (a stopped one's last value)."""
        for router in self.routers:
            if router.proc is not None and router.proc.poll() is None:
                self._counted[router.router_id] = self.metric(router, "mcp_router_may_have_started_total")
        return sum(self._counted.values())

    def metric(self, proc: Any, name: str) -> float:
        return metric(proc.metrics_text(), name)

    def router_metric(self, name: str, **labels: str) -> float:
        """A metric summed over the routers still running."""
        live = [r for r in self.routers if r.proc is not None and r.proc.poll() is None]
        return sum(metric(r.metrics_text(), name, **labels) for r in live)

    def close(self) -> None:
        for proc in (*self.routers, self.health, self.scheduler, *self.workers.values()):
            if proc.proc is not None and proc.proc.poll() is None:
                try:
                    proc.proc.kill()  # a fault test's cluster: no need for graceful stops at the end
                    proc.proc.wait(5)
                except OSError:
                    pass
        self.etcd.kill()


def settle(seconds: float) -> None:
    """Let load run through a fault for a while (the fault's own timing, not a synchronisation)."""
    time.sleep(seconds)
