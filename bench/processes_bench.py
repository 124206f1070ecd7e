"""``router --processes``: the e2e figure at c=64 with one router process and with two, in one run.

Both run the same mesh (etcd, one worker, the scheduler, the peers' model over KServe gRPC), one after the
other, under the same load generator spreading its 64 clients over 16 connections (the kernel hands each
connection to one process). On a 2-core machine the load generator, the worker and the routers share the
cores, so the figure says what a second process costs or gains here, not on a host with cores to spare.
"""

from __future__ import annotations

import time
from pathlib import Path

from router_bench import MODEL, _loadgen, bench_mesh

CONNECTIONS = 16


def bench_processes(repo: Path, seconds: float) -> dict[str, float]:
    figures: dict[str, float] = {}
    with bench_mesh(repo, (MODEL,)) as (tmp, etcd, prefix, _):
        from harness import RouterProcess, wait_for  # noqa: PLC0415  (test tooling, on bench_mesh's path)

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
    figures["router_processes_scaling_c64"] = round(
        figures["router_processes2_rps_c64"] / max(figures["router_processes1_rps_c64"], 1), 2
    )
    print(f"2 router processes vs 1: {figures['router_processes_scaling_c64']}x (on this machine's cores)")
    return figures
