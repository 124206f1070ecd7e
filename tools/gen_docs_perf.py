"""The performance page of ``tools/gen_docs.py``: ``bench/results.json`` as ``make bench`` writes it.

Invariant: every figure is shown beside its baselines from the same run (``FIGURES_SPEC``), never against
a constant; a figure the run lacks is left out, and one the spec does not name is listed at the end.
"""

from __future__ import annotations

import json
from pathlib import Path

from gen_docs_common import HEADER, table

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results.json"

#: One figure a line: name | what it measures | baseline figures from the same run | DESIGN.md §12's target.
FIGURES_SPEC = """
e2e_vs_one_hop_c64 | KServe gRPC through router + worker against the one-hop grpc.aio server, c = 64 \
    | e2e_rps_c64 baseline_rps_c64 e2e_p99_ms_c64 baseline_p99_ms_c64 | ≥ 1.0
e2e_rps_c1 | the same at c = 1 (pays the model's 2-3 ms batch window) | baseline_rps_c1 | —
e2e_rps_c16 | the same at c = 16 | baseline_rps_c16 | —
e2e_cpu_ms_per_req_c64 | server CPU per request at c = 64, ms \
    | e2e_router_cpu_ms_per_req_c64 e2e_worker_cpu_ms_per_req_c64 | ≤ 0.35 (aim)
direct_rps_c64 | SDK direct path (ZeroMQ to the worker), c = 64 \
    | direct_vs_one_hop_c64 direct_vs_router_c64 direct_p99_ms_c64 direct_errors_c64 \\
    | ≥ TorchServe batched gRPC
e2e_bulk_vs_grpc_echo | 16 MiB up and back through router + worker against a plain gRPC echo \
    | e2e_bulk_16mib_ms grpc_echo_16mib_ms | ≤ 1.5
direct_bulk_speedup_vs_grpc_echo | 16 MiB by the direct path (shared memory), times faster than the echo \
    | direct_bulk_16mib_ms grpc_echo_16mib_ms | ≥ 3
e2e_rest_vs_one_hop_c64 | KServe REST (binary tensors) against a one-hop aiohttp server, c = 64 \
    | e2e_rest_rps_c64 rest_one_hop_rps_c64 e2e_rest_p99_ms_c64 | ≥ 1.0
event_loop_lag_p99_ms_c64 | the worst service's event-loop lag p99 at c = 64, ms \
    | event_loop_lag_p99_ms_idle event_loop_lag_p99_ms_c16 event_loop_lag_p99_ms_c1 | < 10
flip_apply_p99_ms | etcd write of a split -> applied by the router, p99 ms | flip_apply_p50_ms | < 50
router_processes_scaling_c64 | 2 router processes against 1, c = 64 over 16 connections \
    | router_processes2_rps_c64 router_processes1_rps_c64 | reported
zmq_vs_grpc_16mib | ZeroMQ against gRPC throughput at 16 MiB | zmq_gbps_16mib grpc_gbps_16mib | ≥ 4
zmq_fraction_of_tcp_16mib | ZeroMQ as a fraction of raw TCP at 16 MiB | tcp_gbps_16mib | ≥ 0.5
duplicate_executions_after_kill | non-idempotent executions run twice after a worker's kill -9 \
    | stateful_may_have_started_after_kill failover_failed_requests | 0
failover_detect_p99_s | kill -9 of a worker -> detected, p99 s \\
    | failover_detect_p50_s failover_lease_ttl_s | within TTL
overload_refusal_p99_ms | refusals at 10x capacity, p99 ms | overload_refused overload_offered_rps \
    overload_admitted_rps overload_admitted_p99_ms overload_baseline_p99_ms overload_rss_growth_mb \\
    | fast, flat memory
router_pick_bounded_max_over_mean | max/mean in flight per worker, bounded loads (c = 1.25), the real pick \
    | router_pick_plain_max_over_mean | ≤ 1.3
ring_bounded_max_over_mean | the same, ring simulation alone | ring_plain_max_over_mean | ≤ 1.25
batching_speedup_c64 | dynamic batching against batch size 1, tiny MLP, 64 concurrent \
    | batching_rps_c64 batching_rps_c64_batch1 batching_mean_batch_c64 | ≥ 4
reconcile_10000_models_s | a new leader's full pass, 10,000 models x 500 workers, s | | < 2
list_models_10000_ms | ListModels over 10,000 models, ms | | < 500
leader_loop_max_block_ms_10000_models | the longest hold of the leader's loop, ms | | < 100
load_to_running_ms | LoadModel -> RUNNING through the scheduler, ms | load_to_running_direct_ms | —
ring_lookup_speedup_vs_article | the router's bounded pick against the article's ring lookup \
    | ring_lookups_per_s ring_article_lookups_per_s | ≥ 50
model_yaml_parse_ms | model.yaml parse + validate, ms | | < 5
mempool_speedup_64mib | native pool against fresh numpy buffers, 64 MiB \\
    | mempool_pool_ms_64mib mempool_numpy_ms_64mib | —
"""
FIGURES = tuple(
    (name.strip(), what.strip(), tuple(base.split()), target.strip())
    for name, what, base, target in (
        line.split("|") for line in FIGURES_SPEC.replace("\\\n", " ").strip().splitlines()
    )
)


def page_performance(results_path: Path = RESULTS) -> str:
    try:
        res = json.loads(results_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SystemExit(f"tools/gen_docs.py: cannot read {results_path}: {err}") from None
    meta = ("machine", "when", "machine_busy_cores_before", "source")
    out = [HEADER.format(src="bench/results.json"), "# Performance\n\n"]
    out.append(
        f"`make bench` on **{res.get('when', 'an unknown date')}**, "
        f"on **{res.get('machine', 'an unknown machine')}**"
        + (f" (cores other processes kept busy before: {res['machine_busy_cores_before']})"
           if res.get("machine_busy_cores_before") is not None else "")
        + ". Every figure is compared with a baseline measured in the same run on the same machine, never "
        "with a constant: compare ratios between machines, not absolute numbers. Targets are DESIGN.md "
        "section 12's. How each figure is measured and what was tried: [Benchmarks](benchmarks.md) and the "
        "[design records](design/index.md).\n\n"
    )  # fmt: skip
    if res.get("source"):
        out.append(f"Source of these figures: {res['source']}\n\n")
    rows, used = [], set(meta)
    for name, what, baselines, target in FIGURES:
        if name not in res:
            continue
        base = "; ".join(f"`{b}` {res[b]}" for b in baselines if b in res) or "—"
        used.update((name, *baselines))
        rows.append((f"`{name}`", what, f"**{res[name]}**", base, target))
    out.append(table(("figure", "what", "value", "baselines and parts, same run", "target"), rows) + "\n")
    rest = sorted(k for k in res if k not in used)
    if rest:
        out.append("## Every other figure of the run\n\n")
        out.append(table(("figure", "value"), [(f"`{k}`", res[k]) for k in rest]))
    return "".join(out).rstrip() + "\n"
