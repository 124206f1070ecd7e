"""Router figures for ``make bench``: end to end through router and worker, flips applied, transports.

Every figure has its baseline from the same run: end to end against a one-hop grpc.aio + numpy server
(``baseline_server.py``) and, over REST, a one-hop aiohttp server (``rest_bench.py``), both serving the
peers' model; a 16 MiB request against a plain gRPC echo; ZeroMQ zero-copy against gRPC and raw TCP on the
same payloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import peer_model
import zmq
from rest_bench import bench_rest

from mcp_devcluster.localetcd import EtcdServer
from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.v2 import control_pb2, control_pb2_grpc, inference_pb2, inference_pb2_grpc, model_pb2
from mcpclient import MeshClient
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
LAG_WINDOW_S = 10.0  # the c=64 run's length, whatever --seconds says: the loop-lag p99 needs its samples


MODEL = "bench-mlp"  # the peers' MLP (peer_model), over the KServe V2 front door
BULK_MODEL = "bench-bulk"
BULK_ROUNDS = 12
LOADGEN_WARMUP_S = 0.5  # bench/loadgen.py's warm-up before it measures
GRPC_LIMITS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def _loadgen(
    target: str, model: str, conc: int, seconds: float, connections: int = 1, *, direct: bool = False
) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(BENCH / "loadgen.py"), target, model, str(conc), str(seconds), "--kserve",
         "--connections", str(connections), *(["--direct"] if direct else [])],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    )  # fmt: skip
    return json.loads(out.stdout)


def _baseline() -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, str(BENCH / "baseline_server.py")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()  # "READY PORT"
    if len(line) != 2:
        proc.kill()
        raise RuntimeError(f"baseline server did not start (it printed {line!r})")
    return proc, f"127.0.0.1:{line[1]}"


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _interleaved_medians_ms(calls: dict[str, Any], rounds: int) -> dict[str, float]:
    """Median milliseconds of each callable, called in turn round after round (after one warm-up each), so
    a figure and its baseline see the same moments of this machine's load."""
    for call in calls.values():
        call()  # warm-up: connections, pool blocks
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def _write_models(repo: Path) -> None:
    peer_model.write(repo)
    same = {True: "yes", False: "NO", None: "(no harness here to compare)"}[peer_model.same_as_peers()]
    print(f"model {MODEL}: the peers harness's MLP; same weights as ../shared/peers: {same}")


def _cpu_figures(cpu: dict[str, float], answered: float, router: str, worker: str) -> dict[str, float]:
    """CPU milliseconds per answered request, of each mesh process and of all of them."""
    per_req = {name: spent * 1e3 / max(answered, 1) for name, spent in cpu.items()}
    total = sum(per_req.values())
    print("mesh CPU per request at c=64: " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in per_req.items())
          + f" (all: {total:.3f} ms; aim <= 0.35)")  # fmt: skip
    return {
        "e2e_cpu_ms_per_req_c64": round(total, 3),
        "e2e_router_cpu_ms_per_req_c64": round(per_req[router], 3),
        "e2e_worker_cpu_ms_per_req_c64": round(per_req[worker], 3),
    }


def bench_direct(router: str, seconds: float, e2e: dict[str, float]) -> dict[str, float]:
    """The SDK's direct path at c=64 (Route once, then ZeroMQ to the worker), against the one-hop baseline
    and the router path measured just before in the same run."""
    direct = _loadgen(router, MODEL, 64, seconds, direct=True)
    figures = {
        "direct_rps_c64": round(direct["rps"]), "direct_p99_ms_c64": round(direct["p99_ms"], 2),
        "direct_errors_c64": direct["errors"], "direct_fallbacks_c64": direct["fallbacks"],
        "direct_vs_one_hop_c64": round(direct["rps"] / max(e2e["baseline_rps_c64"], 1), 2),
        "direct_vs_router_c64": round(direct["rps"] / max(e2e["e2e_rps_c64"], 1), 2),
    }  # fmt: skip
    print(
        f"SDK direct path (Route once, ZeroMQ to the worker), c=64: {direct['rps']:,.0f} req/s, "
        f"p99 {direct['p99_ms']:.1f} ms, {direct['errors']} errors, {direct['fallbacks']} by the router -> "
        f"{figures['direct_vs_one_hop_c64']}x "
        f"the one-hop baseline, {figures['direct_vs_router_c64']}x the router path"
    )
    return figures


def bench_bulk(router: str) -> dict[str, float]:
    """One 16 MiB FP32 request and its 16 MiB reply through router and worker (bench-bulk: ReLU) and by the
    SDK's direct path, against one plain gRPC echo of the same request bytes (echo_server.py, another
    process), the three taking turns round by round."""
    x = np.random.default_rng(0).standard_normal((1, peer_model.BULK_FLOATS)).astype(np.float32)
    request = kserve_pb.ModelInferRequest(model_name=BULK_MODEL)
    request.inputs.add(name="INPUT", datatype="FP32", shape=x.shape)
    request.raw_input_contents.append(x.tobytes())
    payload = request.SerializeToString()
    command = [sys.executable, str(BENCH / "echo_server.py")]
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        _, _, grpc_port, _ = server.stdout.readline().split()
        with (
            grpc.insecure_channel(router, options=GRPC_LIMITS) as channel,
            grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=GRPC_LIMITS) as echo_channel,
            MeshClient(router, timeout=60) as client,
        ):
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            reply = kserve_pb.ModelInferResponse.FromString(infer(payload, timeout=60))
            relu = np.maximum(x, 0).tobytes()
            if np.frombuffer(reply.raw_output_contents[0], np.float32).tobytes() != relu:
                raise RuntimeError("bench-bulk answered something other than ReLU of its input")
            if client.infer(BULK_MODEL, {"INPUT": x}, direct=True)["OUTPUT"].tobytes() != relu:
                raise RuntimeError("bench-bulk answered the direct path something other than ReLU")
            echo = echo_channel.unary_unary("/bench.Echo/Echo")
            medians = _interleaved_medians_ms(
                {
                    "mesh": lambda: infer(payload, timeout=60),
                    "direct": lambda: client.infer(BULK_MODEL, {"INPUT": x}, direct=True),
                    "echo": lambda: echo(payload, timeout=60),
                },
                BULK_ROUNDS,
            )
    finally:
        server.kill()
        server.wait(10)
    mesh_ms, direct_ms, echo_ms = medians["mesh"], medians["direct"], medians["echo"]
    ratio, speedup = mesh_ms / echo_ms, echo_ms / direct_ms
    print(
        f"bulk 16 MiB request + 16 MiB reply through router and worker: median {mesh_ms:.1f} ms | "
        f"plain gRPC echo of the same bytes: {echo_ms:.1f} ms -> {ratio:.2f}x (target <= 1.5x) | "
        f"SDK direct path: {direct_ms:.1f} ms, {speedup:.2f}x faster than the echo (target >= 3x)"
    )
    return {"e2e_bulk_16mib_ms": round(mesh_ms, 1), "grpc_echo_16mib_ms": round(echo_ms, 1),
            "e2e_bulk_vs_grpc_echo": round(ratio, 2), "direct_bulk_16mib_ms": round(direct_ms, 1),
            "direct_bulk_speedup_vs_grpc_echo": round(speedup, 2)}  # fmt: skip


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
    request = inference_pb2.RouteRequest(model=MODEL, routing_key="k")
    samples = []

    async def put(level: int) -> None:
        async with EtcdStore([etcd]) as store:
            await store.put(keys.breaker(MODEL), json.dumps({"level": level}).encode())

    for i in range(rounds):
        level = 1 + i % 2
        t0 = time.perf_counter()
        asyncio.run(put(level))
        while route(request, timeout=5).breaker_level != level:
            pass
        samples.append((time.perf_counter() - t0) * 1e3)
    asyncio.run(put(0))
    return samples


@contextlib.contextmanager
def bench_mesh(repo: Path, models: tuple[str, ...]) -> Iterator[tuple[Path, EtcdServer, str, list[Any]]]:
    """etcd, one worker and the scheduler on a fresh prefix with ``models`` loaded: (tmp, etcd, prefix,
    processes). A router the caller starts goes into ``processes``; all of them stop at the end, etcd
    last, also when a start fails."""
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    _write_models(repo)
    from harness import SchedulerProcess, WorkerProcess  # noqa: PLC0415  (test tooling)

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        etcd = EtcdServer(tmp / "etcd")
        etcd.start()
        prefix = f"/bench{uuid.uuid4().hex[:6]}/mcp"
        procs: list[Any] = []
        try:
            procs.append(WorkerProcess(tmp, etcd.endpoint, repo, prefix=prefix).start())
            procs.append(SchedulerProcess(tmp, etcd.endpoint, prefix=prefix).start())
            control = control_pb2_grpc.ModelControlStub(procs[1].channel())
            for name in models:
                spec = model_pb2.ModelSpec(model=name, versions=["1"], replicas=1)
                control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
            yield tmp, etcd, prefix, procs
        finally:
            for proc in reversed(procs):
                proc.stop()
            etcd.stop()


def bench_e2e(repo: Path, seconds: float) -> dict[str, float]:
    figures: dict[str, float] = {}
    with bench_mesh(repo, (MODEL, BULK_MODEL)) as (tmp, etcd, prefix, procs):
        from harness import RouterProcess  # noqa: PLC0415  (test tooling, on the path bench_mesh set)

        baseline = None
        try:
            router = RouterProcess(tmp, etcd.endpoint, prefix=prefix, scheduler="").start()
            procs.append(router)
            baseline, base_target = _baseline()
            time.sleep(0.5)  # let the router's snapshot take the new routing (not a measurement)
            idle_before = {p.name: _lag_buckets(p) for p in procs}
            time.sleep(seconds)  # the idle baseline of the loop-lag figure: this machine's timer noise
            idle = {p.name: _p99(idle_before[p.name], _lag_buckets(p)) for p in procs}
            for conc in (1, 16, 64):
                lag_before = {p.name: _lag_buckets(p) for p in procs}
                cpu_before = {p.name: _cpu_s(p.proc.pid) for p in procs}
                # the loop-lag figure is a p99 of one sample per 25 ms: at c=64 it gets >= 400 of them
                window = max(seconds, LAG_WINDOW_S) if conc == 64 else seconds
                mesh = _loadgen(router.endpoints["grpc"], MODEL, conc, window)
                cpu = {p.name: _cpu_s(p.proc.pid) - cpu_before[p.name] for p in procs}
                lag_after = {p.name: _lag_buckets(p) for p in procs}
                lags = {name: _p99(lag_before[name], lag_after[name]) for name in lag_after}
                figures[f"event_loop_lag_p99_ms_c{conc}"] = round(max(lags.values()) * 1e3, 2)
                base = _loadgen(base_target, MODEL, conc, seconds)
                if conc == 64:
                    # the CPU bracket holds the load generator's warm-up too, at the same load
                    figures.update(
                        _cpu_figures(
                            cpu, mesh["rps"] * (window + LOADGEN_WARMUP_S), router.name, procs[0].name
                        )
                    )
                figures.update({
                    f"e2e_rps_c{conc}": round(mesh["rps"]), f"e2e_p50_ms_c{conc}": round(mesh["p50_ms"], 2),
                    f"e2e_p99_ms_c{conc}": round(mesh["p99_ms"], 2), f"e2e_errors_c{conc}": mesh["errors"],
                    f"baseline_rps_c{conc}": round(base["rps"]),
                    f"baseline_p99_ms_c{conc}": round(base["p99_ms"], 2),
                })  # fmt: skip
                print(
                    f"end to end (KServe gRPC -> router -> worker, batching), c={conc}: "
                    f"{mesh['rps']:,.0f} req/s, "
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
            figures |= bench_direct(router.endpoints["grpc"], seconds, figures)
            figures |= bench_bulk(router.endpoints["grpc"]) | bench_rest(
                router.endpoints["rest"], MODEL, seconds
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
