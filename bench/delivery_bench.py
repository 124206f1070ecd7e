"""Request-path guarantees for ``make bench``: at most once through a kill, and overload refused fast.

- ``duplicate_executions_after_kill``: a mesh as ``make up`` runs it (three workers, scheduler, health, a
  router), checked load on ``demo-stateful`` (not idempotent) and ``demo-mlp``, and ``kill -9`` of a worker
  holding ``demo-stateful``: request ids run on two workers, counted from every worker's execution
  journal (the killed one's too). Must be 0. ``failover_failed_requests`` is what ``demo-mlp``
  (idempotent) lost meanwhile (must be 0); ``stateful_may_have_started_after_kill`` what ``demo-stateful``
  failed UNAVAILABLE "may have started" (requests its killed worker held: never resent).
- ``overload_*``: one worker with one execution slot serving ``slow-bounded`` (demo-slow, 50 ms a batch of
  8, at most 16 requests in flight per replica): its capacity is measured closed loop at 16 in flight
  (the baseline), then ten times that rate is offered open loop. Admitted requests keep their p99,
  the rest are refused "exceeds maximum queue size" in ``overload_refusal_p99_ms``; router and worker
  RSS before and after is ``overload_rss_growth_mb`` (bounded queues: flat).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_duplicates_after_kill(repo: Path, seconds: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from harness import wait_for  # noqa: PLC0415  (test tooling)
    from meshload import CheckedLoad, Mesh  # noqa: PLC0415

    wanted = {"demo-mlp": 2, "demo-stateful": 2}
    with tempfile.TemporaryDirectory() as tmp:
        mesh = Mesh(Path(tmp), repo, workers=3, routers=1)
        try:
            for model, replicas in wanted.items():
                mesh.load(model, replicas)
            wait_for(lambda: mesh.consistent(wanted), 30, 0.1, "the mesh at its replica counts")
            channel = mesh.channel()
            with (
                # 32 idempotent clients: a kill finds more in flight than a retry budget's burst of 20
                CheckedLoad(channel, "demo-mlp", repo, clients=32) as mlp,
                CheckedLoad(channel, "demo-stateful", repo, clients=8) as stateful,
            ):
                stateful.wait_ok(200)
                time.sleep(seconds / 2)  # load before the fault (the benchmark's schedule)
                victim = next(w for w in mesh.live_workers() if ("demo-stateful", "1") in mesh.held(w))
                victim.kill()
                mesh.add_worker()
                wait_for(lambda: mesh.consistent(wanted), 40, 0.1, "the mesh back at its replica counts")
                stateful.wait_ok(200)
            duplicates = len(mesh.duplicates("demo-stateful"))
            executions = mesh.executions("demo-stateful")
        finally:
            mesh.close()
    a, b = mlp.result, stateful.result
    print(
        f"kill -9 under load: demo-stateful {b.ok} answered, {len(b.not_may_have_started())} failed "
        f"otherwise, {len(b.failures) - len(b.not_may_have_started())} 'may have started' (never resent); "
        f"{duplicates} of {executions} executions were a request run twice (target 0); "
        f"demo-mlp (idempotent) {a.ok} answered, {len(a.failures)} failed (target 0)"
    )
    return {
        "duplicate_executions_after_kill": duplicates,
        "stateful_may_have_started_after_kill": len(b.failures) - len(b.not_may_have_started()),
        "stateful_other_failures_after_kill": len(b.not_may_have_started()) + len(b.wrong),
        "failover_failed_requests": len(a.failures) + len(a.wrong),
    }


def _loadgen(target: str, model: str, conc: int, seconds: float, rate: float = 0.0) -> dict[str, float]:
    args = [sys.executable, str(BENCH / "loadgen.py"), target, model, str(conc), str(seconds)]
    if rate:
        args += ["--rate", str(rate)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=seconds + 60)
    return json.loads(out.stdout)


def bench_overload(repo: Path, seconds: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from harness import RouterProcess, SchedulerProcess, WorkerProcess, wait_for  # noqa: PLC0415

    from mcp_devcluster.localetcd import EtcdServer  # noqa: PLC0415
    from mcpapi.v2 import control_pb2, control_pb2_grpc, model_pb2  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        models = tmp / "models"
        shutil.copytree(repo, models)
        shutil.copytree(models / "demo-slow", models / "slow-bounded")
        path = models / "slow-bounded" / "1" / "model.yaml"
        config = yaml.safe_load(path.read_text())
        config["max_ongoing_requests"] = 16
        path.write_text(yaml.safe_dump(config))
        etcd = EtcdServer(tmp / "etcd")
        etcd.start()
        prefix = f"/bench{uuid.uuid4().hex[:6]}/mcp"
        worker = WorkerProcess(tmp, etcd.endpoint, models, prefix=prefix, exec_slots=1).start()
        scheduler = SchedulerProcess(tmp, etcd.endpoint, prefix=prefix).start()
        router = RouterProcess(tmp, etcd.endpoint, prefix=prefix, scheduler="").start()
        try:
            control = control_pb2_grpc.ModelControlStub(scheduler.channel())
            spec = model_pb2.ModelSpec(model="slow-bounded", versions=["1"], replicas=1)
            control.LoadModel(control_pb2.LoadModelRequest(spec=spec), timeout=60)
            target = router.endpoints["grpc"]
            wait_for(lambda: _loadgen(target, "slow-bounded", 1, 0.2)["rps"] > 0, 30, what="the route")
            base = _loadgen(target, "slow-bounded", 16, max(seconds, 2.0))
            rss0 = {p.name: _rss_mb(p.proc.pid) for p in (router, worker)}
            over = _loadgen(target, "slow-bounded", 4096, max(seconds, 3.0), rate=10 * base["rps"])
            growth = max(_rss_mb(p.proc.pid) - rss0[p.name] for p in (router, worker))
        finally:
            for proc in (router, scheduler, worker):
                proc.stop()
            etcd.stop()
    print(
        f"overload: capacity {base['rps']:,.0f} req/s (p99 {base['p99_ms']:.0f} ms at 16 in flight); "
        f"offered {over['offered_rps']:,.0f} req/s (10x): {over['rps']:,.0f} req/s admitted, "
        f"p99 {over['p99_ms']:.0f} ms; "
        f"{over['refused']} refused 'exceeds maximum queue size', p99 {over['refused_p99_ms']:.1f} ms; "
        f"{over['errors']} other errors; RSS growth {growth:.1f} MB"
    )
    return {
        "overload_capacity_rps": round(base["rps"]),
        "overload_baseline_p99_ms": round(base["p99_ms"], 1),
        "overload_offered_rps": round(over["offered_rps"]),
        "overload_admitted_rps": round(over["rps"]),
        "overload_admitted_p99_ms": round(over["p99_ms"], 1),
        "overload_refused": over["refused"],
        "overload_refusal_p99_ms": round(over["refused_p99_ms"], 2),
        "overload_other_errors": over["errors"],
        "overload_rss_growth_mb": round(growth, 1),
    }
