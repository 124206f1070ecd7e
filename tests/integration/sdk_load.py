"""A client process of the chaos drills: closed-loop threads on one ``mcpclient.MeshClient`` over every
router, every answer checked. ``python sdk_load.py STATUS_FILE --routers A,B --repo DIR --model M``.
Each thread sends its own inputs (seeded by process and thread, so no two clients share one) and checks
the answer: ``demo-stateful`` one positive integer count per row; any other model the demo MLP's
``OUTPUT0`` computed from the weights file of the version that may answer (the one asked for, or with
``--any-version`` version 1 or its fallback 2: the breaker's level 3), counted by version. A failure
whose message is the fault layer's ``injected fault`` is counted as ``injected``, not as failed. Until
SIGTERM (or ``--seconds``; SIGUSR1 pauses it, calls in flight finishing, and SIGUSR2 resumes it) it
rewrites ``STATUS_FILE`` (JSON, atomically) a few times a second: sent, ok, failures by message, wrong
answers, injected, the SDK's own resends, fallbacks and failovers (``ClientStats``), and latency
percentiles of answered and of refused requests; the last write has ``"done": true`` and each answer's
(wall time sent, latency in ms), so that a drill can compare windows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections import Counter, deque
from pathlib import Path

import numpy as np
from harness import mlp_reference

from mcpclient import MeshClient
from mcpcore.errors import MCPError

INJECTED = "injected fault"  # mcp_worker.backends.numpy_backend.INJECTED_FAULT, the fail layer's words
_KEPT = 20000  # latencies kept for percentiles (the most recent)
_SAMPLES = 200_000  # (time sent, latency) of the most recent answers, in the last status only


class Load:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.going = threading.Event()  # cleared while paused
        self.going.set()
        self.client = MeshClient(args.routers.split(","), timeout=args.timeout)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent = self.ok = self.injected = 0
        self.failures: Counter[str] = Counter()
        self.wrong: list[str] = []
        self.versions: Counter[str] = Counter()
        self.ok_ms: list[float] = []
        self.ok_samples: deque[tuple[float, float]] = deque(maxlen=_SAMPLES)  # (wall time sent, ms)
        self.refused_ms: list[float] = []
        versions = ["1", "2"] if args.any_version else [args.version or "1"]
        base = "demo-mlp" if args.model != "demo-stateful" else ""
        self.inputs = []
        for t in range(args.threads):
            rng = np.random.default_rng(args.seed * 1000 + t)
            xs = [rng.random((1, 64), dtype=np.float32) for _ in range(8)]
            refs = (
                [{v: mlp_reference(Path(args.repo), base, v, x) for v in versions} for x in xs]
                if base
                else []
            )
            self.inputs.append((xs, refs))

    def run(self, t: int) -> None:
        xs, refs = self.inputs[t]
        n = 0
        while not self.stop.is_set():
            if not self.going.is_set():  # paused (SIGUSR1): nothing new until SIGUSR2
                self.going.wait(0.1)
                continue
            k, n = n % len(xs), n + 1
            started, sent_at = time.perf_counter(), time.time()
            try:
                out = self.client.infer(
                    self.args.model, {"INPUT0": xs[k]}, version=self.args.version or None,
                    key=f"{self.args.seed}-{t}-{n}", timeout=self.args.timeout,
                )  # fmt: skip
            except MCPError as err:
                ms = (time.perf_counter() - started) * 1e3
                with self.lock:
                    self.sent += 1
                    if INJECTED in err.message:
                        self.injected += 1
                    else:
                        self.failures[f"{err.code.name}: {err.message}"[:300]] += 1
                        self.refused_ms.append(ms)
                continue
            ms = (time.perf_counter() - started) * 1e3
            verdict = self.check(out, refs[k] if refs else None)
            with self.lock:
                self.sent += 1
                if verdict.startswith("wrong"):
                    self.wrong.append(verdict)
                else:
                    self.ok += 1
                    self.versions[verdict] += 1
                    self.ok_ms.append(ms)
                    self.ok_samples.append((sent_at, ms))
                    if len(self.ok_ms) > 2 * _KEPT:
                        del self.ok_ms[:_KEPT]

    @staticmethod
    def check(out: dict[str, np.ndarray], refs: dict[str, np.ndarray] | None) -> str:
        if refs is None:  # demo-stateful: one positive whole count for the one row
            count = out.get("COUNT")
            if count is None or count.shape != (1, 1) or not count[0, 0] >= 1 or count[0, 0] % 1:
                return f"wrong: COUNT {count!r}"
            return "1"
        got = out.get("OUTPUT0")
        for version, ref in refs.items():
            if got is not None and got.shape == ref.shape and np.allclose(got, ref, rtol=1e-5, atol=1e-5):
                return version
        return "wrong: OUTPUT0 is no version's answer to this request's inputs"

    def status(self, done: bool) -> dict:
        with self.lock:
            stats = self.client.stats
            return {
                "model": self.args.model, "sent": self.sent, "ok": self.ok, "injected": self.injected,
                "failures": dict(self.failures), "wrong": self.wrong[:20], "wrong_total": len(self.wrong),
                "versions": dict(self.versions), "resends": stats.resends, "fallbacks": stats.fallbacks,
                "failovers": stats.failovers, "ok_p50_ms": _pct(self.ok_ms, 50),
                "ok_p99_ms": _pct(self.ok_ms, 99), "refused_p99_ms": _pct(self.refused_ms, 99),
                "rss_mib": _rss_mib(), "done": done,
                "ok_samples": [(round(t, 4), round(ms, 3)) for t, ms in self.ok_samples] if done else [],
            }  # fmt: skip


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values[-_KEPT:], q)) if values else 0.0


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _write(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("status", type=Path)
    parser.add_argument("--routers", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", default="")
    parser.add_argument("--any-version", action="store_true", help="version 1 or its fallback 2 may answer")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=0.0)
    args = parser.parse_args()
    load = Load(args)
    # SIGTERM only appends here: Event.set in a handler takes the event's lock, which the main thread
    # holds when the signal lands as its own Event.wait wakes up, and so hung a chaos drill's client
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _: stopping.append(signum))
    signal.signal(signal.SIGUSR1, lambda *_: load.going.clear())  # pause: calls in flight finish
    signal.signal(signal.SIGUSR2, lambda *_: load.going.set())
    threads = [threading.Thread(target=load.run, args=(t,), daemon=True) for t in range(args.threads)]
    for t in threads:
        t.start()
    until = time.monotonic() + args.seconds if args.seconds else float("inf")
    while not stopping and time.monotonic() <= until:
        time.sleep(0.2)
        _write(args.status, load.status(done=False))
    load.stop.set()
    for t in threads:
        t.join(args.timeout + 10)
    _write(args.status, load.status(done=True))
    load.client.close()


if __name__ == "__main__":
    main()
