"""Test harness: a real worker subprocess, its gRPC control stub and a real ZeroMQ client.

Readiness is the worker's own "ready" line on stdout; nothing here sleeps to wait for it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import safetensors.numpy
import zmq

from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2, tensor_pb2, worker_pb2, worker_pb2_grpc
from mcpcore import wire
from mcpcore.etcd_store import EtcdStore

ROOT = Path(__file__).resolve().parents[2]


def make_demo_repository(out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "tools" / "make_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make_models(out)
    return out


def mlp_reference(repo: Path, model: str, version: str, x: np.ndarray) -> np.ndarray:
    """The demo MLP computed directly from its safetensors file, independent of the worker's backend."""
    w = safetensors.numpy.load_file(str(repo / model / version / "weights.safetensors"))
    hidden = np.maximum(x @ w["fc1.weight"] + w["fc1.bias"], 0)
    return hidden @ w["fc2.weight"] + w["fc2.bias"]


class ServiceProcess:
    """A service (``python -m <module>``) in a subprocess; ready once it prints its JSON "ready" line."""

    module = ""

    def __init__(self, tmp: Path, etcd_endpoint: str, *, prefix: str, name: str, **flags: Any) -> None:
        self.tmp = tmp
        self.prefix = prefix
        self.name = name
        self.args = [sys.executable, "-m", self.module]
        for flag, value in flags.items():
            option = flag.replace("_", "-")
            if isinstance(value, bool):  # the services' booleans are --option / --no-option
                self.args.append(f"--{option}" if value else f"--no-{option}")
            else:
                self.args += [f"--{option}", str(value)]
        env_prefix = f"MCP_{self.module.removeprefix('mcp_').upper()}_"
        self.env = {
            **os.environ,
            f"{env_prefix}ETCD_ENDPOINTS": etcd_endpoint,
            f"{env_prefix}ETCD_PREFIX": prefix,
            "MCP_LOG_LEVEL": "INFO",
        }
        self.proc: subprocess.Popen[str] | None = None
        self.endpoints: dict[str, str] = {}
        self.log = tmp / f"{name}.log"

    def start(self, timeout_s: float = 30.0) -> ServiceProcess:
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                self.args, env=self.env, stdout=subprocess.PIPE, stderr=log, text=True, cwd=self.tmp
            )
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            self.stop()
            raise RuntimeError(f"{self.name} not ready in {timeout_s}s:\n{self.log.read_text()[-3000:]}")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited:\n{self.log.read_text()[-3000:]}")
        self.endpoints = json.loads(line)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self) -> None:
        """``kill -9``: no clean-up, no lease revoke."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://{self.endpoints['metrics']}/metrics", timeout=5) as resp:
            return resp.read().decode()


class WorkerProcess(ServiceProcess):
    module = "mcp_worker"

    def __init__(self, tmp: Path, etcd_endpoint: str, repo: Path, *, prefix: str, **flags: Any) -> None:
        self.worker_id = flags.pop("worker_id", f"w-{uuid.uuid4().hex[:8]}")
        flags = {"worker_id": self.worker_id, "repository": repo, "checkpoint_dir": tmp / "ckpt", **flags}
        super().__init__(tmp, etcd_endpoint, prefix=prefix, name=self.worker_id, **flags)

    def control(self) -> worker_pb2_grpc.WorkerControlStub:
        return worker_pb2_grpc.WorkerControlStub(grpc.insecure_channel(self.endpoints["grpc"]))


class SchedulerProcess(ServiceProcess):
    module = "mcp_scheduler"

    def __init__(self, tmp: Path, etcd_endpoint: str, *, prefix: str, **flags: Any) -> None:
        self.scheduler_id = flags.pop("scheduler_id", f"s-{uuid.uuid4().hex[:8]}")
        flags = {"scheduler_id": self.scheduler_id, "grpc_port": 0, "metrics_port": 0, **flags}
        super().__init__(tmp, etcd_endpoint, prefix=prefix, name=self.scheduler_id, **flags)

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.endpoints["grpc"])


class RouterProcess(ServiceProcess):
    module = "mcp_router"

    def __init__(self, tmp: Path, etcd_endpoint: str, *, prefix: str, **flags: Any) -> None:
        self.router_id = flags.pop("router_id", f"r-{uuid.uuid4().hex[:8]}")
        # a short notice period on SIGTERM: the tests' clients do not need one (test_delivery's do)
        flags = {
            "router_id": self.router_id,
            "grpc_port": 0,
            "rest_port": 0,
            "metrics_port": 0,
            "shutdown_delay_s": 0.1,
            **flags,
        }
        super().__init__(tmp, etcd_endpoint, prefix=prefix, name=self.router_id, **flags)

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.endpoints["grpc"])


class HealthProcess(ServiceProcess):
    module = "mcp_health"

    def __init__(self, tmp: Path, etcd_endpoint: str, *, prefix: str, **flags: Any) -> None:
        self.health_id = flags.pop("health_id", f"h-{uuid.uuid4().hex[:8]}")
        flags = {"health_id": self.health_id, "grpc_port": 0, "metrics_port": 0, **flags}
        super().__init__(tmp, etcd_endpoint, prefix=prefix, name=self.health_id, **flags)


@dataclass
class SmallMesh:
    worker: WorkerProcess
    scheduler: SchedulerProcess
    router: RouterProcess


@dataclass
class FullMesh:
    prefix: str
    worker: WorkerProcess
    scheduler: SchedulerProcess
    router: RouterProcess
    health: HealthProcess


@contextmanager
def full_mesh(tmp: Path, etcd_endpoint: str, repo: Path, *, lease_ttl_s: float) -> Iterator[FullMesh]:
    """One worker, a scheduler, a router and a health service on a fresh prefix, nothing loaded; stopped
    in reverse. ``lease_ttl_s``: the worker's lease (long enough for what a test does to it)."""
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    procs: list[Any] = []
    try:
        worker = WorkerProcess(tmp, etcd_endpoint, repo, prefix=prefix, lease_ttl_s=lease_ttl_s)
        procs.append(worker.start())
        scheduler = SchedulerProcess(tmp, etcd_endpoint, prefix=prefix, reconcile_interval_s=0.5)
        procs.append(scheduler.start())
        router = RouterProcess(tmp, etcd_endpoint, prefix=prefix, scheduler="")
        procs.append(router.start())
        health = HealthProcess(tmp, etcd_endpoint, prefix=prefix, check_interval_s=0.2)
        procs.append(health.start())
        yield FullMesh(prefix, worker, scheduler, router, health)
    finally:
        for proc in reversed(procs):
            proc.stop()


@contextmanager
def small_mesh(
    tmp: Path,
    etcd_endpoint: str,
    repo: Path,
    model: str,
    versions: list[str],
    *,
    repository: bool = False,
    router_flags: dict[str, Any] | None = None,
    worker_flags: dict[str, Any] | None = None,
) -> Iterator[SmallMesh]:
    """One worker, a scheduler and a router on a fresh prefix, with ``model``'s ``versions`` loaded and
    each one routed (KServe ModelReady); stopped in reverse. ``repository``: the router forwards
    RepositoryModelLoad/Unload to the scheduler; ``router_flags``, ``worker_flags``: more of their flags."""
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    worker = WorkerProcess(tmp, etcd_endpoint, repo, prefix=prefix, **(worker_flags or {})).start()
    scheduler = router = None
    try:
        scheduler = SchedulerProcess(tmp, etcd_endpoint, prefix=prefix).start()
        target = scheduler.endpoints["grpc"] if repository else ""
        router = RouterProcess(
            tmp, etcd_endpoint, prefix=prefix, scheduler=target, **(router_flags or {})
        ).start()
        spec = model_pb2.ModelSpec(model=model, versions=versions, replicas=1)
        control_pb2_grpc.ModelControlStub(scheduler.channel()).LoadModel(
            control_pb2.LoadModelRequest(spec=spec), timeout=60
        )
        stub = kserve_grpc.GRPCInferenceServiceStub(router.channel())

        def routed() -> bool:
            return all(
                stub.ModelReady(kserve_pb.ModelReadyRequest(name=model, version=v), timeout=5).ready
                for v in versions
            )

        wait_for(routed, what=f"{model} {versions} routed")
        yield SmallMesh(worker, scheduler, router)
    finally:
        for proc in (router, scheduler, worker):
            if proc is not None:
                proc.stop()


def load_and_run(stub: worker_pb2_grpc.WorkerControlStub, model: str, version: str = "1") -> None:
    stub.Load(worker_pb2.LoadRequest(model=model, version=version), timeout=30)
    stub.Resume(worker_pb2.ResumeRequest(model=model, version=version), timeout=10)


@contextmanager
def serving_worker(
    tmp: Path, etcd_endpoint: str, repo: Path, models: tuple[str, ...], **flags: Any
) -> Iterator[WorkerProcess]:
    """A worker process on a fresh prefix with ``models`` (version 1) loaded and RUNNING; stopped after."""
    proc = WorkerProcess(tmp, etcd_endpoint, repo, prefix=f"/t{uuid.uuid4().hex[:8]}/mcp", **flags).start()
    try:
        control = proc.control()
        for model in models:
            load_and_run(control, model)
        yield proc
    finally:
        proc.stop()


class TensorClient:
    """A DEALER with many requests in flight; replies are matched by request id. A context manager."""

    def __init__(self, endpoint: str, *, curve_server_key: bytes | None = None) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 15000)
        if curve_server_key is not None:
            public, secret = zmq.curve_keypair()
            self.sock.curve_serverkey = curve_server_key
            self.sock.curve_publickey = public
            self.sock.curve_secretkey = secret
        self.sock.connect(endpoint)
        self._n = 0
        self._prefix = uuid.uuid4().hex[:6]

    def send(self, model: str, inputs: dict[str, np.ndarray], *, version: str = "", **fields: Any) -> str:
        self._n += 1
        rid = fields.pop("request_id", f"{self._prefix}-{self._n}")  # unique, as a router's are
        header = tensor_pb2.TensorHeader(
            kind=tensor_pb2.KIND_REQUEST, request_id=rid, model=model, version=version, **fields
        )
        self.sock.send_multipart(wire.encode(header, inputs), copy=False)
        return rid

    def recv(self) -> wire.Message:
        return wire.decode(self.sock.recv_multipart())

    def infer(self, model: str, inputs: dict[str, np.ndarray], **kw: Any) -> wire.Message:
        rid = self.send(model, inputs, **kw)
        msg = self.recv()
        assert msg.header.request_id == rid
        wire.raise_for_status(msg.header)
        return msg

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()

    def __enter__(self) -> TensorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def etcd_get(endpoint: str, key: str) -> dict | None:
    """One key's JSON value read through a real store (None when absent)."""

    async def read() -> bytes | None:
        async with EtcdStore([endpoint]) as store:
            kv = await store.get(key)
            return None if kv is None else kv.value

    raw = asyncio.run(read())
    return None if raw is None else json.loads(raw)


def etcd_put(endpoint: str, key: str, value: dict | bytes) -> None:
    """Write a key as an operator would with etcdctl (a dict is written as JSON)."""

    async def write() -> None:
        async with EtcdStore([endpoint]) as store:
            await store.put(key, value if isinstance(value, bytes) else json.dumps(value).encode())

    asyncio.run(write())


class ClientLoad:
    """Closed-loop clients on threads: each calls ``send(key)`` until stopped; counts successes and
    records every gRPC failure (``with ClientLoad(send, 8) as load: ...``)."""

    def __init__(self, send: Any, clients: int = 8) -> None:
        self._send = send
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]

    def _run(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self._send(f"c{i}-{n}")
                with self._lock:
                    self.ok += 1
            except grpc.RpcError as err:
                with self._lock:
                    self.failures.append(f"{err.code().name}: {err.details()}")
            n += 1

    def __enter__(self) -> ClientLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples in Prometheus text that carry every given label value."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if (line.startswith(name + "{") or line.startswith(name + " ")) and all(w in line for w in want)
    )


def freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until every one of its threads is stopped: the signal is delivered
    asynchronously, and a thread still running (grpc's, libzmq's) may take in what is sent meanwhile."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
                continue
            if state not in ("T", "t"):
                return False
        return True

    wait_for(stopped, what=f"every thread of process {pid} to stop")


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.02, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)
