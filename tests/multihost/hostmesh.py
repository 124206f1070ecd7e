"""The mesh spread over namespace hosts: a 3-member etcd cluster, the services, SDK load from a client host.

Every process runs as ``ip netns exec <ns> ...`` (which execs, so the pid is the service's own) and binds
its host's address; the services get the three etcd members as one comma list. Readiness is each
service's "ready" line (``harness.ServiceProcess``), etcd's ``/health``, and for a model the workers' own
Stats next to the records in etcd (``divergence``): nothing here sleeps to wait for something.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from harness import (
    HealthProcess,
    RouterProcess,
    SchedulerProcess,
    ServiceProcess,
    WorkerProcess,
    metric,
    wait_for,
)
from netns import Host, Network

from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2, worker_pb2, worker_pb2_grpc
from mcpcore.errors import MCPError
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.store import KeyValue

ROOT = Path(__file__).resolve().parents[2]
SDK_LOAD = ROOT / "tests" / "integration" / "sdk_load.py"
CLIENT_PORT, PEER_PORT = 2379, 2380
ROUTER_PORT = 8001
#: Leases at the services' defaults (5 s; a refresh every third of it): they must outlive an etcd leader
#: election (etcd's defaults: 1 s election timeout) with one member of three killed. Links and checks are
#: faster than the defaults, so that a cut-off host shows within seconds: the routers' link timeout stays
#: below the workers' lease TTL.
WORKER_FLAGS = {"lease_ttl_s": 5, "heartbeat_interval_s": 1, "zmq_heartbeat_s": 0.3,
                "zmq_heartbeat_timeout_s": 1.5, "drain_timeout_s": 5}  # fmt: skip
ROUTER_FLAGS = {"scheduler": "", "link_heartbeat_s": 0.3, "link_timeout_s": 1.5, "shutdown_delay_s": 0.2}
SCHEDULER_FLAGS = {"reconcile_interval_s": 0.3, "leader_ttl_s": 5}
#: report_timeout_s at its default (10 s): above a heartbeat's interval plus its etcd deadline (5 s), which
#: a write takes in full when it reached a follower just as the etcd leader died (etcd never answers it).
HEALTH_FLAGS = {"check_interval_s": 0.3, "leader_ttl_s": 5, "report_timeout_s": 10}


class EtcdMember:
    """One member of the cluster, on its host's address; its data dir survives a kill."""

    def __init__(self, host: Host, name: str, cluster: str, token: str, tmp: Path) -> None:
        self.host, self.name = host, name
        self.dir = tmp / f"etcd-{name}"
        self.log = self.dir / "etcd.log"
        client, peer = self.url, f"http://{host.ip}:{PEER_PORT}"
        self.args = host.cmd(
            "etcd", f"--name={name}", f"--data-dir={self.dir / 'data'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={cluster}", "--initial-cluster-state=new", f"--initial-cluster-token={token}",
            "--auto-compaction-mode=periodic", "--auto-compaction-retention=10m",
            "--heartbeat-interval=100", "--election-timeout=1000", "--logger=zap", "--log-level=warn",
        )  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host.ip}:{CLIENT_PORT}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def start(self) -> None:
        """Start (a restart reuses the data dir: the member rejoins as itself); ``wait_healthy`` after."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def healthy(self) -> bool:
        """Its ``/health``: true once it serves with a leader (so a member back after a kill has rejoined)."""
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise RuntimeError(f"etcd {self.name} is not running ({code}):\n{self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float = 60.0) -> None:
        wait_for(self.healthy, timeout_s, 0.1, f"etcd member {self.name} healthy")

    def kill(self) -> None:
        """``kill -9``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class NsLoad:
    """``processes`` copies of tests/integration/sdk_load.py on the client host: closed-loop threads on one
    ``mcpclient.MeshClient`` over every router, each answer checked against the weights' reference."""

    def __init__(
        self, host: Host, tmp: Path, routers: list[str], repo: Path, model: str, *, processes: int = 2,
        threads: int = 2, timeout_s: float = 20.0,
    ) -> None:  # fmt: skip
        self.model = model
        self.files = [tmp / f"load-{model}-{i}.json" for i in range(processes)]
        self.procs: list[subprocess.Popen[bytes]] = []
        for i, status in enumerate(self.files):
            args = host.cmd(
                sys.executable, str(SDK_LOAD), str(status), "--routers", ",".join(routers), "--repo",
                str(repo), "--model", model, "--version", "1", "--threads", str(threads), "--seed", str(i),
                "--timeout", str(timeout_s),
            )  # fmt: skip
            with (tmp / f"{status.stem}.log").open("w") as log:
                self.procs.append(subprocess.Popen(args, stdout=log, stderr=log))

    def docs(self) -> list[dict[str, Any]]:
        docs = []
        for f in self.files:
            try:
                docs.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                docs.append({})
        return docs

    def ok(self) -> int:
        return sum(d.get("ok", 0) for d in self.docs())

    def failures(self) -> list[str]:
        """Failed requests ("CODE: message" xN) and wrong answers so far."""
        docs = self.docs()
        failed = sum((Counter(d.get("failures", {})) for d in docs), Counter())
        return [f"{m} x{n}" for m, n in failed.items()] + [w for d in docs for w in d.get("wrong", [])]

    def wait_ok(self, more: int, timeout_s: float = 60.0) -> int:
        """Wait until ``more`` further answers were checked right (traffic flows); the count then."""
        for proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"a load process exited ({proc.returncode}): see load-*.log")
        target = self.ok() + more
        return wait_for(lambda: (n := self.ok()) >= target and n, timeout_s, 0.1, f"{more} more answers")

    def stop(self) -> dict[str, Any]:
        """SIGTERM the clients; their totals (ok, failures by message, wrong, the SDK's failovers)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            proc.wait(60)
        docs = self.docs()
        missing = [str(f) for f, d in zip(self.files, docs, strict=True) if not d.get("done")]
        assert not missing, f"client processes that did not report: {missing}"
        return {
            "ok": sum(d["ok"] for d in docs),
            "sent": sum(d["sent"] for d in docs),
            "failures": dict(sum((Counter(d["failures"]) for d in docs), Counter())),
            "wrong": [w for d in docs for w in d["wrong"]],
            "wrong_total": sum(d["wrong_total"] for d in docs),
            "failovers": sum(d["failovers"] for d in docs),
            "ok_p99_ms": max(d["ok_p99_ms"] for d in docs),
        }

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


class HostMesh:
    """The processes of one mesh over the hosts of ``net``, on one etcd prefix."""

    def __init__(self, net: Network, tmp: Path, repo: Path) -> None:
        self.net, self.tmp, self.repo = net, tmp, repo
        self.prefix = f"/mh{net.run}/mcp"
        self.keys = Keyspace(self.prefix)
        self.etcd: list[EtcdMember] = []
        self.procs: list[ServiceProcess] = []  # every service process started, for the teardown
        self.workers: dict[str, WorkerProcess] = {}
        self.schedulers: list[SchedulerProcess] = []
        self.healths: list[HealthProcess] = []
        self.routers: list[RouterProcess] = []
        self.loads: list[NsLoad] = []

    # -- etcd ------------------------------------------------------------------------------------------
    def start_etcd(self, hosts: list[Host]) -> None:
        cluster = ",".join(f"e{i}=http://{h.ip}:{PEER_PORT}" for i, h in enumerate(hosts, 1))
        self.etcd = [
            EtcdMember(h, f"e{i}", cluster, f"mcp-{self.net.run}", self.tmp) for i, h in enumerate(hosts, 1)
        ]
        for member in self.etcd:  # all at once: the first cannot be healthy before a quorum is up
            member.start()
        for member in self.etcd:
            member.wait_healthy()

    @property
    def etcd_endpoints(self) -> str:
        return ",".join(m.endpoint for m in self.etcd)

    def etcd_leader(self) -> EtcdMember | None:
        """The live member that leads now, by ``etcdctl endpoint status`` of the live members; None while
        they have none (or still name one that is gone)."""
        live = [m for m in self.etcd if m.alive()]
        done = subprocess.run(
            ["etcdctl", f"--endpoints={','.join(m.url for m in live)}", "--command-timeout=3s",
             "endpoint", "status", "-w", "json"],
            capture_output=True, text=True, timeout=30, env={**os.environ, "ETCDCTL_API": "3"}, check=False,
        )  # fmt: skip
        if done.returncode != 0:  # a member too slow to answer within the command timeout: ask again
            return None
        for row, member in zip(json.loads(done.stdout), live, strict=True):
            status = row["Status"]
            if status["header"]["member_id"] == status.get("leader"):
                return member
        return None

    def read(self) -> dict[str, Any]:
        """Every key of the mesh's prefix, JSON-decoded, read through all three members."""
        out = {}
        for kv in self._range():
            try:
                out[kv.key] = json.loads(kv.value)
            except ValueError:
                out[kv.key] = kv.value
        return out

    def registered(self, worker_id: str) -> bool | None:
        """Whether the worker's record is in etcd (None when etcd did not answer in time)."""
        try:
            return self.keys.worker(worker_id) in self.read()
        except MCPError:
            return None

    def leases(self) -> dict[str, int]:
        """The lease of each worker's registration and each leader's key (scheduler, health)."""
        kept = (self.keys.workers_prefix(), f"{self.prefix}/leader/")
        return {kv.key: kv.lease for kv in self._range() if kv.lease and kv.key.startswith(kept)}

    def _range(self) -> tuple[KeyValue, ...]:
        async def get() -> tuple[KeyValue, ...]:
            async with EtcdStore([m.endpoint for m in self.etcd], timeout=3) as store:
                return (await store.get_prefix(self.prefix + "/")).items

        return asyncio.run(get())

    # -- services --------------------------------------------------------------------------------------
    def _make(self, cls: type[ServiceProcess], host: Host, **flags: Any) -> ServiceProcess:
        hosts = {"grpc_host": host.ip, "metrics_host": host.ip, "etcd_endpoints": self.etcd_endpoints}
        if cls is RouterProcess:
            hosts |= {"rest_host": host.ip, "grpc_port": ROUTER_PORT}
        if cls is WorkerProcess:
            proc = cls(self.tmp, self.etcd_endpoints, self.repo, prefix=self.prefix, **hosts, **flags)
        else:
            proc = cls(self.tmp, self.etcd_endpoints, prefix=self.prefix, **hosts, **flags)
        proc.args = host.cmd(*proc.args)  # ip netns exec <ns> python -m mcp_<svc> --grpc-host <ip> ...
        proc.host = host  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def worker(self, host: Host, worker_id: str) -> WorkerProcess:
        flags = {
            **WORKER_FLAGS, "worker_id": worker_id, "zmq_bind": f"tcp://{host.ip}:0",
            "checkpoint_dir": self.tmp / worker_id / "ckpt",
            "execution_log": self.tmp / f"{worker_id}.executions",
        }  # fmt: skip
        proc = self._make(WorkerProcess, host, **flags)
        self.workers[worker_id] = proc  # type: ignore[assignment]
        return proc  # type: ignore[return-value]

    def scheduler(self, host: Host, name: str) -> SchedulerProcess:
        proc = self._make(SchedulerProcess, host, scheduler_id=name, **SCHEDULER_FLAGS)
        self.schedulers.append(proc)  # type: ignore[arg-type]
        return proc  # type: ignore[return-value]

    def health(self, host: Host, name: str) -> HealthProcess:
        proc = self._make(HealthProcess, host, health_id=name, **HEALTH_FLAGS)
        self.healths.append(proc)  # type: ignore[arg-type]
        return proc  # type: ignore[return-value]

    def router(self, host: Host, name: str) -> RouterProcess:
        proc = self._make(RouterProcess, host, router_id=name, **ROUTER_FLAGS)
        self.routers.append(proc)  # type: ignore[arg-type]
        return proc  # type: ignore[return-value]

    @staticmethod
    def start_all(procs: list[ServiceProcess], timeout_s: float = 90.0) -> None:
        """Start the processes at once and wait for every "ready" line (the first failure is raised)."""
        with ThreadPoolExecutor(len(procs)) as pool:
            for future in [pool.submit(p.start, timeout_s) for p in procs]:
                future.result()

    # -- models and their state ------------------------------------------------------------------------
    def load(self, model: str, replicas: int) -> None:
        """LoadModel on a live scheduler (any serves the API), the next one when it is unreachable."""
        spec = model_pb2.ModelSpec(model=model, versions=["1"], replicas=replicas)
        for proc in self.schedulers:
            try:
                control = control_pb2_grpc.ModelControlStub(proc.channel())
                control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=90)
                return
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or proc is self.schedulers[-1]:
                    raise

    def routed(self, model: str) -> bool:
        """Every router says the model is ready (KServe ModelReady)."""
        request = kserve_pb.ModelReadyRequest(name=model, version="1")
        try:
            for router in self.routers:
                with grpc.insecure_channel(router.endpoints["grpc"]) as channel:
                    if not kserve_grpc.GRPCInferenceServiceStub(channel).ModelReady(request, timeout=3).ready:
                        return False
        except grpc.RpcError:
            return False
        return True

    def live_workers(self) -> list[WorkerProcess]:
        return [w for w in self.workers.values() if w.proc is not None and w.proc.poll() is None]

    def held(self, worker: WorkerProcess) -> set[tuple[str, str]]:
        """(model, version) RUNNING on the worker, as the worker itself says (its Stats RPC)."""
        with grpc.insecure_channel(worker.endpoints["grpc"]) as channel:
            stats = worker_pb2_grpc.WorkerControlStub(channel).Stats(worker_pb2.StatsRequest(), timeout=3)
        return {(m.model, m.version) for m in stats.models if model_pb2.ModelState.Name(m.state) == "RUNNING"}

    def divergence(self, wanted: dict[str, int]) -> str:
        """What keeps the mesh from its wanted state, "" once converged: every model's replica records are
        exactly ``wanted`` RUNNING ones, each on a live worker registered now (not draining, its current
        incarnation), reachable, that holds it RUNNING by its own account."""
        try:
            docs = self.read()
        except MCPError as err:
            return f"etcd: {err}"
        live = {w.worker_id: w for w in self.live_workers() if not w.host.cut_off}  # type: ignore[attr-defined]
        for model, n in wanted.items():
            records = {
                k.rsplit("/", 1)[1]: v
                for k, v in docs.items()
                if k.startswith(self.keys.replicas_prefix(model, "1"))
            }
            running = []
            for worker_id, doc in records.items():
                if doc.get("state") != "RUNNING":
                    return f"{model} on {worker_id}: {doc.get('state')}"
                record = docs.get(self.keys.worker(worker_id))
                if worker_id not in live or not isinstance(record, dict):
                    return f"{model}: RUNNING on {worker_id}, which is not a live registered worker"
                if record.get("draining"):
                    return f"{worker_id} is draining"
                if doc.get("info", {}).get("incarnation") != record.get("incarnation"):
                    return f"{model} on {worker_id}: a record of another incarnation"
                try:
                    if (model, "1") not in self.held(live[worker_id]):
                        return f"{model} on {worker_id}: the record says RUNNING, the worker does not hold it"
                except grpc.RpcError as err:
                    return f"{worker_id} Stats: {err.code().name}"
                running.append(worker_id)
            if len(running) != n:
                return f"{model}: RUNNING on {sorted(running)}, {n} wanted"
        return ""

    def wait_converged(self, wanted: dict[str, int], timeout_s: float = 90.0) -> None:
        last = ["not checked yet"]

        def check() -> bool:
            last[0] = self.divergence(wanted)
            return not last[0]

        try:
            wait_for(check, timeout_s, 0.2, f"{wanted} converged")
        except AssertionError as err:
            raise AssertionError(f"{err}: {last[0]}") from None

    def executions(self, worker_id: str) -> int:
        """Requests the worker ran, by its execution journal (on the shared disk: readable while cut off)."""
        journal = self.tmp / f"{worker_id}.executions"
        return len(journal.read_text().splitlines()) if journal.exists() else 0

    def worker_metric(self, worker_id: str, name: str, **labels: str) -> float:
        return metric(self.workers[worker_id].metrics_text(), name, **labels)

    def logs_tail(self, lines: int = 15) -> str:
        """The last lines of every log, for a failure's message."""
        out = []
        for log in sorted([*self.tmp.glob("*.log"), *self.tmp.glob("etcd-*/etcd.log")]):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.relative_to(self.tmp)}\n" + "\n".join(text))
        return "\n".join(out)

    def not_ended(self) -> list[str]:
        """The processes started here that are still running (none after ``close``)."""
        procs = [
            *(p.proc for p in self.procs),
            *(m.proc for m in self.etcd),
            *(p for x in self.loads for p in x.procs),
        ]
        return [
            f"pid {p.pid}: {' '.join(map(str, p.args[4:7]))}"
            for p in procs
            if p is not None and p.poll() is None
        ]

    def close(self) -> None:
        """kill -9 everything (a test cluster: no graceful stops), load clients first."""
        for load in self.loads:
            load.kill()
        for proc in self.procs:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.kill()
                proc.proc.wait(10)
        for member in self.etcd:
            member.kill()


def elapsed(since: float) -> str:
    return f"{time.monotonic() - since:6.1f} s"
