"""Router figures for ``make bench``: end to end through router and worker, flips applied, transports.

Every figure has its baseline from the same run: end to end against a one-hop grpc.aio + numpy server
(``baseline_server.py``), ZeroMQ zero-copy against gRPC and raw TCP on the same payloads.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import numpy as np
import zmq

from mcpapi.v2 import control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc, model_pb2
from mcpclient.localetcd import EtcdServer
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
LAG_WINDOW_S = 10.0  # the c=64 run's length, whatever --seconds says: the loop-lag p99 needs its samples


def _loadgen(target: str, model: str, conc: int, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(BENCH / "loadgen.py"), target, model, str(conc), str(seconds)],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    )  # fmt: skip
    return json.loads(out.stdout)


def _baseline(repo: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / "baseline_server.py"), str(repo)], stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline().split()  # "ready PORT"
    if len(line) != 2:
        proc.kill()
        raise RuntimeError(f"baseline server did not start on {repo} (it printed {line!r})")
    return proc, f"127.0.0.1:{line[1]}"


def _lag_buckets(proc) -> dict[float, float]:  # type: ignore[no-untyped-def]
    """The service's mcp_event_loop_lag_seconds histogram: upper bound -> cumulative count."""
    out: dict[float, float] = {}
    for line in proc.metrics_text().splitlines():
        if line.startswith("mcp_event_loop_lag_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if bound == "+Inf" else float(bound)] = float(line.rsplit(" ", 1)[1])
    return out


def _p99(before: dict[float, float], after: dict[float, float]) -> float:
    """p99 of what was observed between two scrapes, interpolated in its bucket (as histogram_quantile)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if not total:
        return 0.0
    rank, lower, below = 0.99 * total, 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(cumulative - below, 1e-9)
        lower, below = bound, cumulative
    return lower


def _flip_latency(etcd: str, prefix: str, router: str, rounds: int = 20) -> list[float]:
    """etcd write of a breaker level -> the router's Route answers with it (polled over gRPC)."""
    keys = Keyspace(prefix)
    route = inference_pb2_grpc.InferenceStub(grpc.insecure_channel(router)).Route
    request = inference_pb2.RouteRequest(model="demo-mlp", routing_key="k")
    samples = []

    async def put(level: int) -> None:
        async with EtcdStore([etcd]) as store:
            await store.put(keys.breaker("demo-mlp"), json.dumps({"level": level}).encode())

    for i in range(rounds):
        level = 1 + i % 2
        t0 = time.perf_counter()
        asyncio.run(put(level))
        while route(request, timeout=5).breaker_level != level:
            pass
        samples.append((time.perf_counter() - t0) * 1e3)
    asyncio.run(put(0))
    return samples


def bench_e2e(repo: Path, seconds: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from harness import RouterProcess, SchedulerProcess, WorkerProcess  # noqa: PLC0415  (test tooling)

    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        etcd = EtcdServer(tmp / "etcd")
        etcd.start()
        prefix = f"/bench{uuid.uuid4().hex[:6]}/mcp"
        procs: list = []  # type: ignore[type-arg]
        baseline = None
        try:  # everything started is stopped, also when a later start fails
            procs.append(WorkerProcess(tmp, etcd.endpoint, repo, prefix=prefix).start())
            procs.append(SchedulerProcess(tmp, etcd.endpoint, prefix=prefix).start())
            router = RouterProcess(tmp, etcd.endpoint, prefix=prefix, scheduler="").start()
            procs.append(router)
            baseline, base_target = _baseline(repo)
            control = control_pb2_grpc.ModelControlStub(procs[1].channel())
            spec = model_pb2.ModelSpec(model="demo-mlp", versions=["1"], replicas=1)
            control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
            time.sleep(0.5)  # let the router's snapshot take the new routing (not a measurement)
            idle_before = {p.name: _lag_buckets(p) for p in procs}
            time.sleep(seconds)  # the idle baseline of the loop-lag figure: this machine's timer noise
            idle = {p.name: _p99(idle_before[p.name], _lag_buckets(p)) for p in procs}
            for conc in (1, 16, 64):
                lag_before = {p.name: _lag_buckets(p) for p in procs}
                # the loop-lag figure is a p99 of one sample per 25 ms: at c=64 it gets >= 400 of them
                window = max(seconds, LAG_WINDOW_S) if conc == 64 else seconds
                mesh = _loadgen(router.endpoints["grpc"], "demo-mlp", conc, window)
                lag_after = {p.name: _lag_buckets(p) for p in procs}
                lags = {name: _p99(lag_before[name], lag_after[name]) for name in lag_after}
                figures[f"event_loop_lag_p99_ms_c{conc}"] = round(max(lags.values()) * 1e3, 2)
                base = _loadgen(base_target, "demo-mlp", conc, seconds)
                figures[f"e2e_rps_c{conc}"] = round(mesh["rps"])
                figures[f"e2e_p50_ms_c{conc}"] = round(mesh["p50_ms"], 2)
                figures[f"e2e_p99_ms_c{conc}"] = round(mesh["p99_ms"], 2)
                figures[f"e2e_errors_c{conc}"] = mesh["errors"]
                figures[f"baseline_rps_c{conc}"] = round(base["rps"])
                figures[f"baseline_p99_ms_c{conc}"] = round(base["p99_ms"], 2)
                print(
                    f"end to end (client -> router -> worker, batching), c={conc}: {mesh['rps']:,.0f} req/s, "
                    f"p50 {mesh['p50_ms']:.1f} ms, p99 {mesh['p99_ms']:.1f} ms, {mesh['errors']} errors | "
                    f"one-hop grpc.aio+numpy baseline: {base['rps']:,.0f} req/s, p99 {base['p99_ms']:.1f} ms"
                )
            figures["e2e_vs_one_hop_c64"] = round(
                figures["e2e_rps_c64"] / max(figures["baseline_rps_c64"], 1), 2
            )
            figures["event_loop_lag_p99_ms_idle"] = round(max(idle.values()) * 1e3, 2)
            print(
                f"event loop lag p99 at c=1/16/64: {figures['event_loop_lag_p99_ms_c1']} / "
                f"{figures['event_loop_lag_p99_ms_c16']} / {figures['event_loop_lag_p99_ms_c64']} ms; "
                "at c=64: "
                + ", ".join(f"{name} {lag * 1e3:.1f} ms" for name, lag in lags.items())
                + " (target < 10 ms) | idle, same processes: "
                + ", ".join(f"{name} {lag * 1e3:.1f} ms" for name, lag in idle.items())
            )
            flips = sorted(_flip_latency(etcd.endpoint, prefix, router.endpoints["grpc"]))
            figures["flip_apply_p50_ms"] = round(statistics.median(flips), 2)
            figures["flip_apply_p99_ms"] = round(flips[min(len(flips) - 1, int(len(flips) * 0.99))], 2)
            print(
                f"etcd write -> applied by the router: p50 {figures['flip_apply_p50_ms']} ms, "
                f"p99 {figures['flip_apply_p99_ms']} ms over {len(flips)} flips (target p99 < 50 ms)"
            )
        finally:
            if baseline is not None:
                baseline.kill()
            for proc in reversed(procs):
                proc.stop()
            etcd.stop()
    return figures


# -- transports ----------------------------------------------------------------------------------------
def _rate(call, payload: bytes, seconds: float) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(GB/s counting both directions, client CPU s per GB) for a request/reply callable."""
    n, cpu0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        call(payload)
        n += 1
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    gb = 2 * n * len(payload) / 1e9
    return gb / elapsed, cpu / gb


class _Clients:
    """Request/reply callables to the three echo servers of ``echo_server.py`` (another process)."""

    def __init__(self, zmq_endpoint: str, grpc_port: int, tcp_port: int) -> None:
        self.dealer = zmq.Context.instance().socket(zmq.DEALER)
        self.dealer.connect(zmq_endpoint)
        options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=options)
        self.grpc = self.channel.unary_unary("/bench.Echo/Echo")
        self.tcp = socket.create_connection(("127.0.0.1", tcp_port))
        self.tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(16 << 20)

    def zmq(self, payload: bytes) -> None:
        self.dealer.send(payload, copy=False)
        self.dealer.recv(copy=False)

    def tcp_call(self, payload: bytes) -> None:
        self.tcp.sendall(len(payload).to_bytes(8, "little"))
        self.tcp.sendall(payload)
        view, got = memoryview(self.buf)[: len(payload)], 0
        while got < len(payload):
            got += self.tcp.recv_into(view[got:], len(payload) - got)

    def close(self) -> None:
        self.dealer.close(linger=0)
        self.channel.close()
        self.tcp.close()


def bench_transport(repo: Path, seconds: float) -> dict[str, float]:
    server = subprocess.Popen(
        [sys.executable, str(BENCH / "echo_server.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    _, endpoint, grpc_port, tcp_port = server.stdout.readline().split()
    clients = _Clients(endpoint, int(grpc_port), int(tcp_port))
    figures: dict[str, float] = {}
    try:
        for label, size in (("1kib", 1 << 10), ("1mib", 1 << 20), ("16mib", 16 << 20)):
            payload = np.random.default_rng(0).bytes(size)
            zmq_gbs, zmq_cpu = _rate(clients.zmq, payload, seconds / 3)
            grpc_gbs, grpc_cpu = _rate(clients.grpc, payload, seconds / 3)
            tcp_gbs, _ = _rate(clients.tcp_call, payload, seconds / 3)
            figures[f"zmq_gbps_{label}"], figures[f"zmq_cpu_s_per_gb_{label}"] = (
                round(zmq_gbs, 3),
                round(zmq_cpu, 3),
            )
            figures[f"grpc_gbps_{label}"], figures[f"grpc_cpu_s_per_gb_{label}"] = (
                round(grpc_gbs, 3),
                round(grpc_cpu, 3),
            )
            figures[f"tcp_gbps_{label}"] = round(tcp_gbs, 3)
            print(
                f"request/reply {label}: ZeroMQ zero-copy {zmq_gbs:.3f} GB/s ({zmq_cpu:.2f} client CPU "
                f"s/GB), gRPC {grpc_gbs:.3f} GB/s ({grpc_cpu:.2f}), raw TCP {tcp_gbs:.3f} GB/s"
            )
        figures["zmq_vs_grpc_16mib"] = round(figures["zmq_gbps_16mib"] / figures["grpc_gbps_16mib"], 2)
        figures["zmq_fraction_of_tcp_16mib"] = round(figures["zmq_gbps_16mib"] / figures["tcp_gbps_16mib"], 2)
        print(
            f"16 MiB: ZeroMQ {figures['zmq_vs_grpc_16mib']}x gRPC (target >= 4x), "
            f"{figures['zmq_fraction_of_tcp_16mib']:.0%} of raw TCP (target >= 50%)"
        )
    finally:
        clients.close()
        server.kill()
        server.wait()
    return figures
