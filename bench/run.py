"""``make bench``: measure, print ratios against baselines from the same run, write bench/results.json.

Every figure is compared with a baseline measured in this run on this machine (DESIGN.md section 12),
never with a constant, so the ratios carry over between machines while the absolute numbers do not.
Figures that later issues add keep their names from DESIGN.md section 13.

    python bench/run.py [--only NAME ...] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mcp_worker.backends import create_backend
from mcp_worker.batching import BatchConfig, Dispatcher, ModelShare
from mcp_worker.repository import ModelRepository
from mcpcore.keyring import Keyring
from mcpcore.model_yaml import parse_model_yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from delivery_bench import bench_duplicates_after_kill, bench_overload  # noqa: E402
from health_bench import bench_failover  # noqa: E402
from mempool_bench import bench_mempool  # noqa: E402
from processes_bench import bench_processes  # noqa: E402
from receive_bench import bench_receive  # noqa: E402
from ring_bench import bench_ring  # noqa: E402
from router_bench import bench_e2e, bench_transport  # noqa: E402
from router_pick_bench import bench_router_pick  # noqa: E402
from scheduler_bench import bench_load_to_running  # noqa: E402
from scheduler_scale_bench import bench_scheduler_scale  # noqa: E402

RESULTS = ROOT / "bench" / "results.json"
#: Cores other processes may keep busy before a run without a warning (a quiet machine shows ~0.02).
BUSY_WARN_CORES = 0.1


def _cpu_jiffies(stat: Path) -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from /proc/stat's first line (idle and iowait are not busy)."""
    fields = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - fields[3] - fields[4], total


def busy_cores(seconds: float = 1.0, stat: Path = Path("/proc/stat")) -> float | None:
    """How many cores the machine kept busy over ``seconds`` (every process): measured before the figures,
    since a leftover process from an earlier run makes them all read low. None without /proc/stat."""
    try:
        busy0, total0 = _cpu_jiffies(stat)
        time.sleep(seconds)
        busy1, total1 = _cpu_jiffies(stat)
    except (OSError, ValueError, IndexError):
        return None
    return (busy1 - busy0) / max(1, total1 - total0) * (os.cpu_count() or 1)


def demo_repository(out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "tools" / "make_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make_models(out)
    return out


# -- model.yaml ---------------------------------------------------------------------------------------


def bench_model_yaml(repo: Path, seconds: float) -> dict[str, float]:
    text = (repo / "demo-mlp" / "1" / "model.yaml").read_text()
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        parse_model_yaml(text, model="demo-mlp", version="1")
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    print(f"model.yaml parse + validate: median {ms:.3f} ms over {len(times)} runs (target < 5 ms)")
    return {"model_yaml_parse_ms": round(ms, 4)}


# -- dynamic batching ---------------------------------------------------------------------------------


async def _closed_loop(config: BatchConfig, run_batch: Callable[..., Any], concurrency: int, seconds: float):
    """``concurrency`` clients, each sending one row and waiting for it, for ``seconds``: requests/s."""
    with ThreadPoolExecutor(2) as pool:
        dispatcher = Dispatcher(slots=2, executor=pool)
        queue = dispatcher.add_model("demo-mlp/1", config, run_batch, ModelShare(1, 0.5))
        rng = np.random.default_rng(0)
        rows = [rng.random((1, 64), np.float32) for _ in range(concurrency)]
        done = 0
        stop_at = time.perf_counter() + seconds

        async def client(i: int) -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                answer = asyncio.get_running_loop().create_future()
                queue.enqueue(f"c{i}-{done}", {"INPUT0": rows[i]}, answer.set_result)
                if isinstance(result := await answer, BaseException):
                    raise result
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
        stats = queue.stats()
        await dispatcher.close()
    return done / elapsed, stats.mean_batch_size


def bench_batching(repo: Path, seconds: float) -> dict[str, float]:
    artifact = ModelRepository(repo, Keyring.load(repo / "keyring.json")).load("demo-mlp", "1")
    backend = create_backend(artifact.config, artifact.weights)
    batched = BatchConfig.from_model_config(artifact.config)
    single = replace(batched, max_batch_size=1, preferred_batch_sizes=(), max_queue_delay_s=0.0)
    rps_1, _ = asyncio.run(_closed_loop(single, backend.infer, 64, seconds))
    rps_64, mean_batch = asyncio.run(_closed_loop(batched, backend.infer, 64, seconds))
    speedup = rps_64 / rps_1
    print(
        f"dynamic batching, demo MLP, 64 concurrent: {rps_64:,.0f} req/s (mean batch {mean_batch:.1f}) vs "
        f"batch size 1: {rps_1:,.0f} req/s -> {speedup:.1f}x (target >= 4x)"
    )
    return {
        "batching_rps_c64": round(rps_64),
        "batching_rps_c64_batch1": round(rps_1),
        "batching_mean_batch_c64": round(mean_batch, 2),
        "batching_speedup_c64": round(speedup, 2),
    }


BENCHES: dict[str, Callable[[Path, float], dict[str, float]]] = {
    "model_yaml": bench_model_yaml,
    "batching": bench_batching,
    "scheduler_scale": bench_scheduler_scale,
    "load_to_running": bench_load_to_running,
    "ring": bench_ring,
    "router_pick": bench_router_pick,
    "transport": bench_transport,
    "e2e": bench_e2e,
    "failover": bench_failover,
    "duplicates": bench_duplicates_after_kill,
    "overload": bench_overload,
    "mempool": bench_mempool,
    "receive": bench_receive,
    "processes": bench_processes,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHES), help="run only these benchmarks")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per figure")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results file (--only merges)")
    args = parser.parse_args(argv)
    # a full run writes a fresh file (no stale figure under a new date); --only merges into it
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.only and args.out.exists() else {}
    busy = busy_cores()
    if busy is not None and busy > BUSY_WARN_CORES:
        print(
            f"warning: {busy:.2f} of {os.cpu_count()} cores were busy before the run: every figure will read "
            "low. Look for leftover processes (ps aux --sort=-%cpu) and stop them.",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory() as tmp:
        repo = demo_repository(Path(tmp) / "models")
        for name in args.only or list(BENCHES):
            results.update(BENCHES[name](repo, args.seconds))
    results["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    results["machine_busy_cores_before"] = None if busy is None else round(busy, 2)
    results["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
