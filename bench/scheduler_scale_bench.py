"""The scheduler at scale, for ``make bench``: real etcd, real scheduler processes, simulated workers.

One run (``scale_run``) against a fresh etcd:
1. ``sim_workers.py`` registers ``workers`` simulated workers (one process serving every WorkerControl
   endpoint; each heartbeats once a second, as a real worker does).
2. etcd is filled with ``models`` specs, each with a RUNNING replica record on one worker (written with
   that worker's incarnation, as the worker would) and its routing: a cluster that is already converged.
3. Scheduler A starts, leads and publishes every status; it is stopped. Scheduler B starts: from the
   election won to its first full pass done is ``reconcile_<models>_models_s``; the pass must change
   nothing (no replica, routing or status key written).
4. ListModels against B (median of 5) is ``list_models_<models>_ms``.
5. 1,000 more specs arrive at once: ``placements_per_s`` is 1,000 over the time until every one is
   RUNNING, routed, and its status says so.
6. Steady state: every write under the prefix for ``steady_s`` (watched) is
   ``etcd_writes_per_s_steady_<models>_models``; the workers' load reports among them are
   ``etcd_heartbeats_per_s_<models>_models`` (one process simulating 500 workers falls behind their
   once-a-second beat, so it is counted, not assumed). The goal: nothing beyond the heartbeats.
7. B's ``mcp_scheduler_loop_block_max_seconds`` (the longest its event loop was held since it won the
   election, through steps 3-6) is ``leader_loop_max_block_ms_<models>_models``.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from mcp_devcluster.localetcd import EtcdServer
from mcp_scheduler.view import ModelSpecDoc, TrafficDoc
from mcpapi.v2 import control_pb2, control_pb2_grpc
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.lifecycle import ReplicaRecord, ReplicaState
from mcpcore.store import Put

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
TXN_OPS = 100
NEW_MODELS = 1000


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def _put_all(store: EtcdStore, items: list[tuple[str, bytes]]) -> None:
    for i in range(0, len(items), TXN_OPS):
        await store.txn([], [Put(k, v) for k, v in items[i : i + TXN_OPS]])


def _spec(name: str) -> bytes:
    return ModelSpecDoc(model=name, versions=("1",), replicas=1, memory_bytes=100 * MiB).to_json()


async def _fill(endpoint: str, keys: Keyspace, models: int, workers: int, incarnation: str) -> None:
    items: list[tuple[str, bytes]] = []
    for m in range(models):
        name, worker = f"m{m:05d}", f"sim-{m % workers:03d}"
        info = {"incarnation": incarnation, "memory_bytes": 100 * MiB}
        record = ReplicaRecord(ReplicaState.RUNNING, time.time(), reason="bench", info=info)
        items += [
            (keys.model_spec(name), _spec(name)),
            (keys.replica(name, "1", worker), record.to_json()),
            (keys.model_routing(name), TrafficDoc(stable="1").to_json()),
        ]
    async with EtcdStore([endpoint]) as store:
        await _put_all(store, items)


async def _revisions(endpoint: str, keys: Keyspace) -> dict[str, int]:
    """The mod revision of every key the scheduler could write for a converged model."""
    async with EtcdStore([endpoint]) as store:
        out = {}
        for prefix in (keys.models_prefix(), keys.replicas_prefix()):
            out.update({kv.key: kv.mod_revision for kv in (await store.get_prefix(prefix)).items})
        return out


async def _revision(endpoint: str) -> int:
    async with EtcdStore([endpoint]) as store:
        return await store.ping()


async def _place_new(endpoint: str, keys: Keyspace, start: int) -> float:
    """Write NEW_MODELS specs at once; seconds until each one's status says 1/1 RUNNING."""
    names = [f"n{start + i:05d}" for i in range(NEW_MODELS)]
    async with EtcdStore([endpoint]) as store:
        t0 = time.perf_counter()
        await _put_all(store, [(keys.model_spec(n), _spec(n)) for n in names])
        waiting, running, routed = set(names), set(), set()
        while waiting:
            await asyncio.sleep(0.1)
            for kv in (await store.get_prefix(keys.models_prefix() + "n")).items:
                parsed = keys.parse_model_key(kv.key)
                if parsed is None or parsed[0] not in waiting:
                    continue
                if parsed[1] == "routing":
                    routed.add(parsed[0])
                elif parsed[1] == "status":
                    doc = json.loads(kv.value)
                    if doc.get("versions", {}).get("1", {}).get("running") == 1 and not doc.get("pending"):
                        running.add(parsed[0])
            waiting -= running & routed
            if time.perf_counter() - t0 > 120:
                raise RuntimeError(f"{len(waiting)} of {NEW_MODELS} new models not RUNNING after 120 s")
        return time.perf_counter() - t0


def _wait_full_pass(scheduler: Any, timeout_s: float = 300) -> float:
    """Seconds the scheduler's first full pass as leader took, once it reports one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = scheduler.metrics_text()
        took = _metric(text, "mcp_scheduler_full_pass_seconds")
        if _metric(text, "mcp_scheduler_leader_ratio") == 1 and took:
            return took
        time.sleep(0.1)
    raise RuntimeError("the scheduler did not finish a full pass in time")


async def _steady_writes(endpoint: str, keys: Keyspace, seconds: float) -> dict[str, float]:
    """Writes per second under the prefix over ``seconds``: all, the workers' load reports among them,
    and everything else (what the scheduler wrote, with nothing to do)."""
    counts = {"all": 0, "heartbeats": 0}
    async with EtcdStore([endpoint]) as store:
        start = await store.ping()

        async def count() -> None:
            async for batch in store.watch_prefix(keys.prefix + "/", start_revision=start + 1):
                for ev in batch:
                    counts["all"] += 1
                    parsed = keys.parse_worker_key(ev.key)
                    counts["heartbeats"] += bool(parsed and parsed[1])

        watch = asyncio.create_task(count())
        await asyncio.sleep(seconds)
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    return {k: n / seconds for k, n in counts.items()}


class Cluster:
    """etcd, the simulated workers and the schedulers of one run; ``close`` stops them all."""

    def __init__(self, tmp: Path, workers: int, *, capacity_gib: int = 64) -> None:
        sys.path.insert(0, str(ROOT / "tests" / "integration"))
        from harness import SchedulerProcess  # noqa: PLC0415  (test tooling, only here)

        self._scheduler_process = SchedulerProcess
        self.tmp = tmp
        self.etcd = EtcdServer(tmp / "etcd")
        self.etcd.start()
        self.prefix, self.incarnation = f"/bench{uuid.uuid4().hex[:6]}/mcp", uuid.uuid4().hex[:12]
        self.keys = Keyspace(self.prefix)
        self.schedulers: list[Any] = []
        self.sim = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "sim_workers.py"), "--etcd", self.etcd.endpoint,
             "--prefix", self.prefix, "--workers", str(workers), "--incarnation", self.incarnation,
             "--capacity-gib", str(capacity_gib)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.sim.stdout is not None
        json.loads(self.sim.stdout.readline())  # every worker registered and serving

    def scheduler(self) -> Any:
        # no periodic resync inside the run: its figures are for passes on election and for changes
        s = self._scheduler_process(
            self.tmp, self.etcd.endpoint, prefix=self.prefix, leader_ttl_s=2, resync_interval_s=600
        )
        self.schedulers.append(s)
        return s.start(timeout_s=120)

    def close(self) -> None:
        for s in self.schedulers:
            s.stop()
        self.sim.terminate()
        self.sim.wait(timeout=30)
        self.etcd.stop()


def _list_models_ms(scheduler: Any, models: int) -> float:
    stub = control_pb2_grpc.ModelControlStub(grpc.insecure_channel(scheduler.endpoints["grpc"]))
    took = []
    for _ in range(5):
        t0 = time.perf_counter()
        listed = stub.ListModels(control_pb2.ListModelsRequest(), timeout=60).models
        took.append(time.perf_counter() - t0)
        if len(listed) != models:
            raise RuntimeError(f"ListModels returned {len(listed)} models, {models} expected")
    return statistics.median(took) * 1e3


def scale_run(models: int, workers: int, *, steady_s: float = 10.0) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp_name:
        cluster = Cluster(Path(tmp_name), workers)
        try:
            endpoint, keys = cluster.etcd.endpoint, cluster.keys
            asyncio.run(_fill(endpoint, keys, models, workers, cluster.incarnation))
            first = cluster.scheduler()
            first_pass = _wait_full_pass(first)  # writes every status: the converged state is complete
            first.stop()
            before = asyncio.run(_revisions(endpoint, keys))
            second = cluster.scheduler()
            reconcile_s = _wait_full_pass(second)
            changed = sum(1 for k, r in asyncio.run(_revisions(endpoint, keys)).items() if before.get(k) != r)
            if changed:
                raise RuntimeError(f"a pass with nothing to do wrote {changed} key(s)")
            list_ms = _list_models_ms(second, models)
            loads = _metric(second.metrics_text(), 'mcp_scheduler_actions_total{kind="load"}')
            placing = asyncio.run(_place_new(endpoint, keys, models))
            loads = _metric(second.metrics_text(), 'mcp_scheduler_actions_total{kind="load"}') - loads
            time.sleep(2.0)  # the last statuses and routings land
            reconciles = _metric(second.metrics_text(), "mcp_scheduler_reconciles_total")
            writes = asyncio.run(_steady_writes(endpoint, keys, steady_s))
            text = second.metrics_text()
            reconciles = _metric(text, "mcp_scheduler_reconciles_total") - reconciles
            block = _metric(text, "mcp_scheduler_loop_block_max_seconds")
        finally:
            cluster.close()
    figures = {
        f"reconcile_{models}_models_s": round(reconcile_s, 3),
        f"list_models_{models}_ms": round(list_ms, 1),
        f"placements_per_s_{models}_models": round(NEW_MODELS / placing, 1),
        f"etcd_writes_per_s_steady_{models}_models": round(writes["all"], 1),
        f"etcd_heartbeats_per_s_{models}_models": round(writes["heartbeats"], 1),
        f"leader_loop_max_block_ms_{models}_models": round(block * 1e3, 1),
        f"loads_per_new_model_{models}_models": round(loads / NEW_MODELS, 3),  # 1.0: none placed twice
        # models reconciled in the steady window (heartbeats must queue none; a periodic resync would)
        f"reconciles_steady_{models}_models": reconciles,
    }
    print(
        f"scheduler, {models} models on {workers} simulated workers: a new leader's first pass "
        f"{reconcile_s:.2f} s with nothing to do (the first leader's, writing every status, "
        f"{first_pass:.2f} s); "
        f"ListModels {list_ms:.0f} ms; {NEW_MODELS} new models placed at {NEW_MODELS / placing:.0f}/s; "
        f"steady etcd writes {writes['all']:.0f}/s, of which workers' heartbeats "
        f"{writes['heartbeats']:.0f}/s; "
        f"leader loop held at most {block * 1e3:.0f} ms"
    )
    return figures


def bench_scheduler_scale(repo: Path, seconds: float) -> dict[str, float]:
    small = scale_run(1000, 50, steady_s=seconds)
    out = scale_run(10000, 500, steady_s=max(seconds, 10.0))
    out["reconcile_1000_models_s"] = small["reconcile_1000_models_s"]
    out["placements_per_s"] = out.pop("placements_per_s_10000_models")
    return out
