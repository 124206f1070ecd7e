"""The router path with the process tuning on and off, on a 1-core and a 2-core view of this machine.

``python bench/tuning_probe.py [--seconds 8] [--rounds 1] [--views 0 0,1]``

For each CPU view (``taskset -c 0``, ``taskset -c 0,1``) and each tuning (``mcpcore.tuning``) a fresh mesh
(worker, scheduler, router; the peers' MLP, ``peer_model``) starts under ``taskset``, and ``bench/loadgen.py``
drives KServe ModelInfer through the router at c=64, on the CPUs outside the view (on the view's own
when there are none, as on a 2-core host). The tunings:

- ``off``: Python's and glibc's own behaviour (no gc freeze, Python's gc threshold and 5 ms switch
  interval, helper threads left alone, glibc's heap thresholds);
- ``on``: every knob as the 2-core defaults set it;
- ``default``: what ``Tuning.for_cores`` picks for the view (on one core: Python's switch interval, no
  batched helpers; on two: the same as ``on``).

Prints, for each, req/s, p99 and the mesh's CPU milliseconds a request (its three processes, /proc), then
the on/off and default/off ratios per view. With ``--rounds`` > 1 the tunings run in turn round after
round and the medians are printed. Defaults take about 2.5 minutes; run it on a quiet machine (a busy
one reads low and noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import peer_model

from mcp_devcluster.localetcd import EtcdServer
from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2
from mcpcore.tuning import PYTHON_SWITCH_INTERVAL_S, Tuning

ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench-mlp"
CONC = 64
LOADGEN_WARMUP_S = 0.5  # bench/loadgen.py's warm-up, inside the CPU bracket
KNOBS_ON = Tuning.for_cores(2)
KNOBS_OFF = Tuning(
    gc_freeze=False, gc_young_objects=0, switch_interval_s=PYTHON_SWITCH_INTERVAL_S,
    heap_mmap_threshold_bytes=0, heap_trim_threshold_bytes=0, batch_helper_threads=False,
)  # fmt: skip
TUNINGS: dict[str, Tuning | None] = {"off": KNOBS_OFF, "on": KNOBS_ON, "default": None}


def _env(prefix: str, knobs: Tuning | None) -> dict[str, str]:
    if knobs is None:
        return {}
    return {f"{prefix}TUNING__{name.upper()}": str(value) for name, value in knobs.__dict__.items()}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpus(view: str) -> set[int]:
    return {int(c) for c in view.split(",")}


def _wait_routed(router: Any, deadline_s: float = 60.0) -> None:
    """Until the router reports the model ready (KServe ModelReady: its routes learnt from etcd)."""
    from harness import wait_for  # noqa: PLC0415  (test tooling)

    stub = kserve_grpc.GRPCInferenceServiceStub(router.channel())
    ready = kserve_pb.ModelReadyRequest(name=MODEL, version="1")
    wait_for(lambda: stub.ModelReady(ready, timeout=5).ready, deadline_s, what=f"{MODEL} routed")


def measure(
    tmp: Path, etcd: str, repo: Path, view: str, *, knobs: Tuning | None, seconds: float
) -> dict[str, Any]:
    """A fresh worker, scheduler and router under ``taskset -c view`` with ``knobs`` (None: their
    defaults), the model loaded through the scheduler; then the load, and the mesh's CPU under it."""
    from harness import RouterProcess, SchedulerProcess, WorkerProcess  # noqa: PLC0415  (test tooling)

    prefix = f"/probe{uuid.uuid4().hex[:6]}/mcp"
    worker = WorkerProcess(tmp, etcd, repo, prefix=prefix)
    scheduler = SchedulerProcess(tmp, etcd, prefix=prefix)
    router = RouterProcess(tmp, etcd, prefix=prefix, scheduler="")
    procs = [worker, scheduler, router]
    for proc in procs:
        proc.args = ["taskset", "-c", view, *proc.args]
        proc.env.update(_env(f"MCP_{proc.module.removeprefix('mcp_').upper()}_", knobs))
        proc.env["MCP_LOG_LEVEL"] = "WARNING"
    started = []
    try:
        for proc in procs:
            started.append(proc.start())
        spec = model_pb2.ModelSpec(model=MODEL, versions=["1"], replicas=1)
        control = control_pb2_grpc.ModelControlStub(scheduler.channel())
        control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
        _wait_routed(router)
        others = sorted(os.sched_getaffinity(0) - _cpus(view))
        pin = ["taskset", "-c", ",".join(map(str, others))] if others else []
        before = {p.name: _cpu_s(p.proc.pid) for p in procs}
        out = subprocess.run(
            [*pin, sys.executable, str(ROOT / "bench" / "loadgen.py"), router.endpoints["grpc"], MODEL,
             str(CONC), str(seconds), "--kserve"],
            capture_output=True, text=True, check=True, timeout=seconds + 60,
        )  # fmt: skip
        cpu = sum(_cpu_s(p.proc.pid) - before[p.name] for p in procs)
    finally:
        for proc in reversed(started):
            proc.stop()
    load = json.loads(out.stdout)
    answered = load["rps"] * (seconds + LOADGEN_WARMUP_S)
    return {
        "rps": load["rps"], "p99_ms": load["p99_ms"], "errors": load["errors"],
        "cpu_ms_per_req": cpu * 1e3 / max(answered, 1), "loadgen_cpus": ",".join(map(str, others)) or view,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=8.0, help="load per measurement (after 0.5 s warm-up)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every tuning in turn (medians)")
    parser.add_argument("--views", nargs="+", default=["0", "0,1"], help="taskset CPU lists")
    args = parser.parse_args(argv)
    mine = os.sched_getaffinity(0)
    views = [v for v in args.views if _cpus(v) <= mine]
    for skipped in sorted(set(args.views) - set(views)):
        print(f"view {skipped}: skipped, this process may use CPUs {sorted(mine)} only")
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        repo = tmp / "models"
        peer_model.write(repo)
        etcd = EtcdServer(tmp / "etcd")
        etcd.start()
        try:
            for _ in range(args.rounds):
                for view in views:
                    for name, knobs in TUNINGS.items():
                        got = measure(tmp, etcd.endpoint, repo, view, knobs=knobs, seconds=args.seconds)
                        results.setdefault((view, name), []).append(got)
                        print(
                            f"taskset -c {view:<4} tuning {name:<8} {got['rps']:>8,.0f} req/s  "
                            f"p99 {got['p99_ms']:6.1f} ms  {got['cpu_ms_per_req']:.3f} CPU ms/req  "
                            f"errors {got['errors']}  (loadgen on CPUs {got['loadgen_cpus']})",
                            flush=True,
                        )
        finally:
            etcd.stop()
    print("\nmedians" if args.rounds > 1 else "")
    for view in views:
        med = {
            name: {
                k: statistics.median(r[k] for r in results[(view, name)]) for k in ("rps", "cpu_ms_per_req")
            }
            for name in TUNINGS
        }
        default = Tuning.for_cores(len(_cpus(view)))
        print(
            f"taskset -c {view}: on/off req/s {med['on']['rps'] / max(med['off']['rps'], 1):.3f}, "
            f"CPU/req {med['on']['cpu_ms_per_req'] / max(med['off']['cpu_ms_per_req'], 1e-9):.3f}; "
            f"default/off req/s {med['default']['rps'] / max(med['off']['rps'], 1):.3f}, "
            f"CPU/req {med['default']['cpu_ms_per_req'] / max(med['off']['cpu_ms_per_req'], 1e-9):.3f} "
            f"(default here: switch {default.switch_interval_s * 1e3:g} ms, "
            f"batched helpers {'on' if default.batch_helper_threads else 'off'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
