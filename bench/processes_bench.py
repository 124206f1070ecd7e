"""``router --processes``: the e2e figure at c=64 with one router process and with two, in one run.

Both run the same mesh (etcd, one worker, the scheduler, the peers' model over KServe gRPC), one after the
other, under the same load generator spreading its 64 clients over 16 connections (the kernel hands each
connection to one process). On a 2-core machine the load generator, the worker and the routers share the
cores, so the figure says what a second process costs or gains here, not on a host with cores to spare.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from pathlib import Path

from router_bench import MODEL, ROOT, _loadgen, _write_models

from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2
from mcpclient.localetcd import EtcdServer

CONNECTIONS = 16


def bench_processes(repo: Path, seconds: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    _write_models(repo)
    from harness import RouterProcess, SchedulerProcess, WorkerProcess, wait_for  # noqa: PLC0415

    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        etcd = EtcdServer(tmp / "etcd")
        etcd.start()
        prefix = f"/bench{uuid.uuid4().hex[:6]}/mcp"
        procs: list = []  # type: ignore[type-arg]
        try:
            procs.append(WorkerProcess(tmp, etcd.endpoint, repo, prefix=prefix).start())
            procs.append(SchedulerProcess(tmp, etcd.endpoint, prefix=prefix).start())
            control = control_pb2_grpc.ModelControlStub(procs[1].channel())
            spec = model_pb2.ModelSpec(model=MODEL, versions=["1"], replicas=1)
            control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
            for n in (1, 2):
                router = RouterProcess(tmp, etcd.endpoint, prefix=prefix, scheduler="", processes=n).start()
                try:
                    target = router.endpoints["grpc"]
                    wait_for(lambda t=target: _loadgen(t, MODEL, 1, 0.2)["rps"] > 0, 30, what="the route")
                    time.sleep(0.5)  # every process has the routing table by now (not a measurement)
                    got = _loadgen(target, MODEL, 64, seconds, connections=CONNECTIONS)
                finally:
                    router.stop()
                figures[f"router_processes{n}_rps_c64"] = round(got["rps"])
                figures[f"router_processes{n}_p99_ms_c64"] = round(got["p99_ms"], 2)
                print(
                    f"router with {n} process(es), c=64 over {CONNECTIONS} connections: "
                    f"{got['rps']:,.0f} req/s, p99 {got['p99_ms']:.1f} ms, {got['errors']} errors"
                )
        finally:
            for proc in reversed(procs):
                proc.stop()
            etcd.stop()
    figures["router_processes_scaling_c64"] = round(
        figures["router_processes2_rps_c64"] / max(figures["router_processes1_rps_c64"], 1), 2
    )
    print(f"2 router processes vs 1: {figures['router_processes_scaling_c64']}x (on this machine's cores)")
    return figures
