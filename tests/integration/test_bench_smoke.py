"""make bench still runs and writes its named figures (a smoke run: values are not judged here)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
        "machine_busy_cores_before",
        "when",
    ):
        assert name in results
    assert results["batching_rps_c64"] > 0 and results["batching_rps_c64_batch1"] > 0


def _run_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_busy_cores_counts_a_process_that_spins():
    """What make bench measures before its figures: a leftover busy process shows (and is warned of)."""
    run = _run_module()
    spin = "print(flush=True)\nwhile True:\n    pass\n"
    spinner = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
    try:
        spinner.stdout.readline()  # it is up and spinning
        assert run.busy_cores(0.5) >= 0.5
    finally:
        spinner.kill()
        spinner.wait()


def test_cpu_jiffies_reads_proc_stat_busy_and_total(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 20 1000 50 3 2 1 7 0\ncpu0 50 2 10 500 25 1 1 0 3 0\n")
    busy, total = _run_module()._cpu_jiffies(stat)
    assert (busy, total) == (100 + 5 + 20 + 3 + 2 + 1, 1181)


def test_busy_cores_is_the_busy_share_of_every_cpu_between_two_reads(tmp_path, monkeypatch):
    """Half of all jiffies busy between the reads is half of every core: os.cpu_count() / 2 cores."""
    run = _run_module()
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 0 1000 0 0 0 0 0 0\n")
    monkeypatch.setattr(run.time, "sleep", lambda s: stat.write_text("cpu  150 0 10 1030 10 0 0 0 0 0\n"))
    assert run.busy_cores(1.0, stat) == pytest.approx((os.cpu_count() or 1) * 60 / 100)
