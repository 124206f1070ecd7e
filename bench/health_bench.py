"""Health figures for ``make bench``: how long after ``kill -9`` a worker's replicas are marked ERROR."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from mcp_devcluster.localetcd import EtcdServer
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace

ROOT = Path(__file__).resolve().parents[1]
TTL_S = 1
KILLS = 10


async def _wait_error(endpoint: str, key: str, timeout_s: float) -> float:
    """Seconds until the replica record at ``key`` says ERROR (watched, not polled)."""
    started = time.perf_counter()
    async with EtcdStore([endpoint]) as store:
        kv = await store.get(key)
        if kv is not None and b'"ERROR"' in kv.value:
            return time.perf_counter() - started
        revision = kv.mod_revision if kv else await store.ping()
        stream = store.watch_prefix(key, start_revision=revision + 1)
        async with asyncio.timeout(timeout_s), contextlib.aclosing(stream) as batches:
            async for batch in batches:
                if any(b'"state":"ERROR"' in ev.value for ev in batch):
                    return time.perf_counter() - started
    raise TimeoutError


def bench_failover(repo: Path, seconds: float) -> dict[str, float]:
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from harness import HealthProcess, WorkerProcess, load_and_run  # noqa: PLC0415  (test tooling)

    samples = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        etcd = EtcdServer(tmp / "etcd")
        etcd.start()
        prefix = f"/bench{uuid.uuid4().hex[:6]}/mcp"
        health = HealthProcess(
            tmp, etcd.endpoint, prefix=prefix, check_interval_s=0.1, report_timeout_s=5
        ).start()
        waiter = asyncio.new_event_loop()  # one loop for every kill: grpc.aio's poller outlives a closed one
        try:
            for _ in range(KILLS):
                worker = WorkerProcess(tmp, etcd.endpoint, repo, prefix=prefix, lease_ttl_s=TTL_S,
                                       heartbeat_interval_s=0.2).start()  # fmt: skip
                load_and_run(worker.control(), "demo-mlp")
                key = Keyspace(prefix).replica("demo-mlp", "1", worker.worker_id)
                task = waiter.create_task(_wait_error(etcd.endpoint, key, TTL_S + 10))
                waiter.run_until_complete(asyncio.sleep(0.05))  # the watch is open before the kill
                killed = time.perf_counter()
                worker.kill()
                waiter.run_until_complete(task)
                samples.append(time.perf_counter() - killed)
        finally:
            waiter.run_until_complete(asyncio.sleep(0.2))  # let the channels' last callbacks run
            waiter.close()
            health.stop()
            etcd.stop()
    samples.sort()
    p50, p99 = statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    print(f"worker kill -9 -> its replicas ERROR: p50 {p50:.2f} s, p99 {p99:.2f} s over {KILLS} kills "
          f"(lease TTL {TTL_S} s: detection is bounded by the TTL plus etcd's lease check)")  # fmt: skip
    return {
        "failover_detect_p50_s": round(p50, 3),
        "failover_detect_p99_s": round(p99, 3),
        "failover_lease_ttl_s": TTL_S,
    }
