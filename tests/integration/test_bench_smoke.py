"""make bench still runs and writes its named figures (a smoke run: values are not judged here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the multi-process figures (e2e, failover, load_to_running, scheduler_scale) drive the same harness as the
# router, health and scheduler integration tests (test_scheduler_scale runs a small scale_run); here only
# the in-process ones run, to keep the suite fast
FAST = ["model_yaml", "batching", "ring", "transport"]


def test_bench_writes_named_figures(tmp_path):
    out = tmp_path / "results.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "run.py"),
            "--seconds",
            "0.2",
            "--out",
            str(out),
            "--only",
            *FAST,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    results = json.loads(out.read_text())
    for name in (
        "model_yaml_parse_ms",
        "batching_speedup_c64",
        "ring_lookup_speedup_vs_article",
        "ring_bounded_max_over_mean",
        "zmq_vs_grpc_16mib",
        "when",
    ):
        assert name in results
    assert results["batching_rps_c64"] > 0 and results["batching_rps_c64_batch1"] > 0
