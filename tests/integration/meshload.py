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
import signal
import socket
import subprocess
import sys
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

from mcp_devcluster.localetcd import EtcdServer
from mcpapi.v2 import control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc, model_pb2, worker_pb2
from mcpcore import dtypes
from mcpcore.keys import Keyspace

MAY_HAVE_STARTED = "may have started"
INJECTED = "injected fault"  # the fail layer's words (mcp_worker.backends.numpy_backend.INJECTED_FAULT)
HERE = Path(__file__).parent
#: Links time out before the workers' 2 s leases; a SIGTERM gives clients half a second's notice.
ROUTER_FLAGS = {"scheduler": "", "link_heartbeat_s": 0.3, "link_timeout_s": 1.2, "shutdown_delay_s": 0.5}
SCHEDULER_FLAGS = {"reconcile_interval_s": 0.3, "leader_ttl_s": 2}
HEALTH_FLAGS = {"check_interval_s": 0.2, "leader_ttl_s": 2, "report_timeout_s": 3}
PROXY_HOST = "127.0.0.2"  # loopback too (127/8), so a worker's published address can be a proxy's


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
    injected: int = 0  # answers that were the fault layer's injected errors (not failures)
    resent: int = 0  # the client's own resends and failovers (the SDK's ClientStats)
    versions: Counter[str] = field(default_factory=Counter)  # answers by the version that computed them
    ok_p99_ms: float = 0.0
    refused_p99_ms: float = 0.0
    ok_samples: list[tuple[float, float]] = field(default_factory=list)  # (wall time sent, ms) per answer

    @property
    def sent(self) -> int:
        return self.ok + len(self.failures) + len(self.wrong) + self.injected

    def not_may_have_started(self) -> list[str]:
        return [f for f in self.failures if MAY_HAVE_STARTED not in f]


class CheckedLoad:
    """``with CheckedLoad(channel, "demo-mlp", repo, clients=4) as load: ...``; then ``load.result``."""

    def __init__(
        self, channel: grpc.Channel, model: str, repo: Path, *, clients: int = 4, any_version: bool = False
    ) -> None:
        """``any_version``: ask for no version, so breaker level 3's fallback (version 2) may answer."""
        self._infer = inference_pb2_grpc.InferenceStub(channel).Infer
        self._model = model
        self._version = "" if any_version else "1"
        versions = ("1", "2") if any_version else ("1",)
        self.result = LoadResult()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._going = threading.Event()  # cleared: paused, no new request is sent
        self._going.set()
        self._inputs = []
        for c in range(clients):  # distinct inputs per client: a swapped answer cannot match
            xs = [np.random.default_rng(c * 100 + k).random((1, 64), dtype=np.float32) for k in range(8)]
            refs = (
                [{v: mlp_reference(repo, "demo-mlp", v, x) for v in versions} for x in xs]
                if model != "demo-stateful"
                else []
            )
            self._inputs.append((xs, refs))
        self._threads = [threading.Thread(target=self._run, args=(c,), daemon=True) for c in range(clients)]
        self._ok_ms: list[float] = []
        self._refused_ms: list[float] = []

    def __enter__(self) -> CheckedLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pause(self) -> None:
        """Send nothing more until ``resume`` (calls in flight finish)."""
        self._going.clear()

    def resume(self) -> None:
        self._going.set()

    def stop(self) -> LoadResult:
        self._stop.set()
        self._going.set()
        for t in self._threads:
            t.join(60)
        for name, values in (("ok_p99_ms", self._ok_ms), ("refused_p99_ms", self._refused_ms)):
            setattr(self.result, name, float(np.percentile(values, 99)) if values else 0.0)
        return self.result

    def ok(self) -> int:
        return self.result.ok

    def fallback_answers(self) -> int:
        return self.result.versions["2"]

    def wait_ok(self, more: int, timeout_s: float = 30.0) -> None:
        """Wait until ``more`` further requests succeeded (traffic flows)."""
        target = self.result.ok + more
        wait_for(lambda: self.result.ok >= target, timeout_s, what=f"{more} more answers from {self._model}")

    def _run(self, c: int) -> None:
        xs, refs = self._inputs[c]
        n = 0
        while not self._stop.is_set():
            self._going.wait()
            k = n % len(xs)
            n += 1
            request = inference_pb2.InferRequest(
                model=self._model, version=self._version, routing_key=f"c{c}-{n}", inputs=[tensor(xs[k])],
                request_id=str(n),  # every client counts from 1: ids repeat across clients, as in life
            )  # fmt: skip
            began, sent_at = time.perf_counter(), time.time()
            try:
                reply = self._infer(request, timeout=20)
            except grpc.RpcError as err:
                with self._lock:
                    if INJECTED in (err.details() or ""):
                        self.result.injected += 1
                    else:
                        self.result.failures.append(f"{err.code().name}: {err.details()}")
                        self._refused_ms.append((time.perf_counter() - began) * 1e3)
                continue
            ms = (time.perf_counter() - began) * 1e3
            out = reply.outputs[0]
            got = np.frombuffer(out.data, np.float32).reshape(tuple(out.shape))
            ref = refs[k].get(reply.version) if refs else None
            with self._lock:
                if reply.request_id != str(n):
                    self.result.wrong.append(f"client {c}: sent id {n}, got {reply.request_id}")
                elif refs and (ref is None or not np.allclose(got, ref, rtol=1e-5, atol=1e-5)):
                    self.result.wrong.append(f"client {c} request {n}: not its answer ({reply.version})")
                else:
                    self.result.ok += 1
                    self.result.versions[reply.version] += 1
                    self._ok_ms.append(ms)
                    self.result.ok_samples.append((sent_at, ms))
                    if not refs:
                        self.result.counts.append((reply.worker_id, int(got[0, 0])))


class SdkLoad:
    """The chaos drills' load: ``processes`` client processes (``sdk_load.py``), each closed-loop threads
    on one ``mcpclient.MeshClient`` over every router, every answer checked; the same surface as
    ``CheckedLoad`` (``wait_ok``, ``stop``, ``result``)."""

    def __init__(
        self, mesh: Mesh, model: str, *, processes: int = 2, threads: int = 3, any_version: bool = False,
        timeout_s: float = 20.0, seed: int = 0,
    ) -> None:  # fmt: skip
        self._model = model
        routers = ",".join(r.endpoints["grpc"] for r in mesh.routers)
        self._files = [mesh.tmp / f"load-{model}-{uuid.uuid4().hex[:6]}.json" for _ in range(processes)]
        self._procs = []
        for i, status in enumerate(self._files):
            args = [
                sys.executable, str(HERE / "sdk_load.py"), str(status), "--routers", routers, "--repo",
                str(mesh.repo), "--model", model, "--threads", str(threads), "--seed", str(seed * 100 + i),
                "--timeout", str(timeout_s), *(["--any-version"] if any_version else ["--version", "1"]),
            ]  # fmt: skip
            log = (mesh.tmp / f"{status.stem}.log").open("w")
            self._procs.append(subprocess.Popen(args, stdout=log, stderr=log))
        self.result = LoadResult()

    def __enter__(self) -> SdkLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _docs(self) -> list[dict]:
        docs = []
        for f in self._files:
            try:
                docs.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                docs.append({})
        return docs

    def ok(self) -> int:
        return sum(d.get("ok", 0) for d in self._docs())

    def fallback_answers(self) -> int:
        return sum(d.get("versions", {}).get("2", 0) for d in self._docs())

    def wait_ok(self, more: int, timeout_s: float = 60.0) -> None:
        target = self.ok() + more
        wait_for(lambda: self.ok() >= target, timeout_s, 0.1, f"{more} more answers from {self._model}")

    def pause(self) -> None:
        """Send nothing more until ``resume`` (SIGUSR1; calls in flight finish: a client frozen with
        SIGSTOP past its deadline would count them as timeouts)."""
        for proc in self._procs:
            proc.send_signal(signal.SIGUSR1)

    def resume(self) -> None:
        for proc in self._procs:
            proc.send_signal(signal.SIGUSR2)

    def stop(self) -> LoadResult:
        if not self._procs:
            return self.result
        for proc in self._procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self._procs:
            proc.wait(60)
        self._procs = []
        docs = self._docs()
        missing = [str(f) for f, d in zip(self._files, docs, strict=True) if not d.get("done")]
        assert not missing, f"client processes that did not report: {missing}"
        r = self.result
        for d in docs:
            r.ok += d["ok"]
            r.injected += d["injected"]
            r.failures += [m for m, n in d["failures"].items() for _ in range(n)]
            r.wrong += d["wrong"] + ["..."] * (d["wrong_total"] - len(d["wrong"]))
            r.resent += d["resends"] + d["fallbacks"] + d["failovers"]
            r.versions.update(d["versions"])
            r.ok_p99_ms = max(r.ok_p99_ms, d["ok_p99_ms"])
            r.refused_p99_ms = max(r.refused_p99_ms, d["refused_p99_ms"])
            r.ok_samples += [(t, ms) for t, ms in d["ok_samples"]]
        return r


class Mesh:
    """The processes of a local cluster on a private etcd, with names the fault tests act on."""

    def __init__(
        self, tmp: Path, repo: Path, *, workers: int = 3, routers: int = 2, schedulers: int = 1,
        healths: int = 1, partitionable: int = 0, stats_window_s: float = 30.0,
    ) -> None:  # fmt: skip
        """``partitionable``: that many of the workers have their ZeroMQ link through a TCP proxy;
        ``stats_window_s``: the routers' error-count window (the breaker policy's metrics window should
        match it: the health service rates what the routers count over their own window)."""
        self._router_flags = {**ROUTER_FLAGS, "stats_window_s": stats_window_s}
        self.tmp, self.repo = tmp, repo
        self.etcd = EtcdServer(tmp / "etcd")
        self.prefix = f"/m{uuid.uuid4().hex[:6]}/mcp"
        self.keys = Keyspace(self.prefix)
        self.etcd.start()
        self.workers: dict[str, WorkerProcess] = {}
        self.proxies: dict[
            str, subprocess.Popen[str]
        ] = {}  # worker -> the proxy its ZeroMQ link runs through
        for i in range(workers):
            self.add_worker(partitionable=i < partitionable)
        self.schedulers = [self._start(SchedulerProcess, **SCHEDULER_FLAGS) for _ in range(schedulers)]
        self.healths = [self._start(HealthProcess, **HEALTH_FLAGS) for _ in range(healths)]
        self.routers = [self._start(RouterProcess, **self._router_flags) for _ in range(routers)]
        self._counted: dict[str, float] = {}

    @property
    def scheduler(self) -> SchedulerProcess:
        return next(p for p in self.schedulers if _alive(p))

    @property
    def health(self) -> HealthProcess:
        return next(p for p in self.healths if _alive(p))

    @property
    def control(self) -> control_pb2_grpc.ModelControlStub:
        return control_pb2_grpc.ModelControlStub(self.scheduler.channel())

    def leader(self, role: str) -> Any:
        """The scheduler or health process that leads now (its ``mcp_<role>_leader_ratio`` is 1), or None."""
        for proc in self.schedulers if role == "scheduler" else self.healths:
            if _alive(proc) and self.metric(proc, f"mcp_{role}_leader_ratio") == 1:
                return proc
        return None

    def restart(self, old: Any) -> Any:
        """A fresh process in place of a killed or stopped service, on its gRPC port (as a supervisor
        restarts it: clients configured with the address find it again)."""
        cls = type(old)
        flags = {RouterProcess: self._router_flags, SchedulerProcess: SCHEDULER_FLAGS}.get(cls, HEALTH_FLAGS)
        port = int(old.endpoints["grpc"].rsplit(":", 1)[1])
        group = {RouterProcess: self.routers, SchedulerProcess: self.schedulers, HealthProcess: self.healths}[
            cls
        ]
        new = wait_for(lambda: _try_start(lambda: self._start(cls, grpc_port=port, **flags)), 30, 0.2,
                       f"{cls.__name__} back on port {port}")  # fmt: skip
        group[group.index(old)] = new
        return new

    def _start(self, cls: Any, **flags: Any) -> Any:
        return cls(self.tmp, self.etcd.endpoint, prefix=self.prefix, **flags).start()

    def add_worker(self, worker_id: str | None = None, *, partitionable: bool = False) -> WorkerProcess:
        """A worker; ``partitionable``: its ZeroMQ endpoint is published as a TCP proxy's (127.0.0.2, the
        same port), so ``partition`` can cut the routers' link to it while etcd, the scheduler and the
        health service still reach it."""
        worker_id = worker_id or f"w-{uuid.uuid4().hex[:6]}"
        extra: dict[str, Any] = {}
        old_proxy = self.proxies.pop(worker_id, None)  # a worker started again under its id
        if old_proxy is not None:
            old_proxy.kill()
            old_proxy.wait(5)
        if partitionable:
            port = _free_port()
            # zmq_local off: a router on this host must not go around the proxy by the same-host endpoint
            extra = {"zmq_bind": f"tcp://127.0.0.1:{port}", "advertise_host": PROXY_HOST, "zmq_local": False,
                     "grpc_host": PROXY_HOST, "metrics_host": PROXY_HOST}  # fmt: skip
            proxy = subprocess.Popen(
                [sys.executable, str(HERE / "tcp_proxy.py"), f"{PROXY_HOST}:{port}", f"127.0.0.1:{port}"],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert proxy.stdout is not None and proxy.stdout.readline(), "the TCP proxy did not start"
            self.proxies[worker_id] = proxy
        worker = WorkerProcess(
            self.tmp, self.etcd.endpoint, self.repo, prefix=self.prefix, worker_id=worker_id,
            lease_ttl_s=2, heartbeat_interval_s=0.3, zmq_heartbeat_s=0.3, zmq_heartbeat_timeout_s=1.2,
            execution_log=self.tmp / f"{worker_id}.executions", drain_timeout_s=5, **extra,
        ).start()  # fmt: skip
        self.workers[worker_id] = worker
        return worker

    def partition(self, worker: WorkerProcess, cut: bool) -> None:
        """Cut (or heal) the link between the routers and a ``partitionable`` worker."""
        self.proxies[worker.worker_id].send_signal(signal.SIGUSR1 if cut else signal.SIGUSR2)

    def load(self, model: str, replicas: int, *, fallback: str = "") -> None:
        """LoadModel on any live scheduler (followers serve the API too), the next one if it is gone."""
        # the fallback version is kept loaded (one copy) by the scheduler for breaker level 3
        spec = model_pb2.ModelSpec(model=model, versions=["1"], replicas=replicas, fallback_version=fallback)
        for proc in [p for p in self.schedulers if _alive(p)]:
            try:
                control = control_pb2_grpc.ModelControlStub(proc.channel())
                control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
                return
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or proc is self.schedulers[-1]:
                    raise

    def breaker_level(self, model: str) -> int:
        doc = etcd_get(self.etcd.endpoint, self.keys.breaker(model))
        return int(doc.get("level", 0)) if doc else 0

    def rss_mib(self, proc: Any) -> float:
        with open(f"/proc/{proc.proc.pid}/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))

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
        for proxy in self.proxies.values():
            proxy.kill()
        for proc in (*self.routers, *self.healths, *self.schedulers, *self.workers.values()):
            if proc.proc is not None and proc.proc.poll() is None:
                try:
                    proc.proc.kill()  # a fault test's cluster: no need for graceful stops at the end
                    proc.proc.wait(5)
                except OSError:
                    pass
        self.etcd.kill()


def _alive(proc: Any) -> bool:
    return proc.proc is not None and proc.proc.poll() is None


def _try_start(start: Any) -> Any:
    """``start()``, or None when the process could not bind yet (its old port still held)."""
    try:
        return start()
    except RuntimeError:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settle(seconds: float) -> None:
    """Let load run through a fault for a while (the fault's own timing, not a synchronisation)."""
    time.sleep(seconds)
