"""``mcpctl``'s views of the cluster: protobuf replies as plain JSON documents, and those documents as rich
tables. No I/O: the commands fetch, these functions only shape what was fetched.

Invariants:
- The JSON documents are what ``-o json`` prints and what the tables are drawn from, so the two forms
  never disagree. Field names are stable (scripts read them); enum values are their names ("RUNNING").
- Tables size their columns to their content (``box=None``: columns apart, no borders, like kubectl).
"""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table
from rich.text import Text

from mcpapi.v2 import health_pb2, model_pb2

__all__ = [
    "add_row",
    "breaker_doc",
    "model_doc",
    "models_table",
    "plain_table",
    "replica_doc",
    "summary_table",
    "worker_doc",
    "workers_table",
]


def replica_doc(r: model_pb2.ReplicaStatus) -> dict[str, Any]:
    return {
        "model": r.model,
        "version": r.version,
        "worker": r.worker_id,
        "state": model_pb2.ModelState.Name(r.state),
        "since_unix_ms": r.since_unix_ms,
        "reason": r.reason,
    }


def breaker_doc(b: model_pb2.BreakerState) -> dict[str, Any]:
    return {
        "level": b.level,
        "reason": b.reason,
        "set_by": b.set_by,
        "since_unix_ms": b.since_unix_ms,
        "until_unix_ms": b.until_unix_ms,
    }


def model_doc(m: model_pb2.ModelStatus) -> dict[str, Any]:
    spec = m.spec
    return {
        "model": m.model,
        "state": model_pb2.ModelState.Name(m.state),
        "versions": list(spec.versions),
        "replicas_per_version": spec.replicas,
        "replicas_wanted": spec.replicas * len(spec.versions),
        "replicas_running": sum(1 for r in m.replicas if r.state == model_pb2.RUNNING),
        "replicas": [replica_doc(r) for r in m.replicas],
        "traffic": {
            "stable": m.traffic.stable,
            "canary": m.traffic.canary,
            "canary_percent": m.traffic.canary_percent,
        },
        "breaker": breaker_doc(m.breaker),
        "fallback_version": spec.fallback_version,
        "load_on_demand": spec.load_on_demand,
        "pending": m.pending,
    }


def worker_doc(w: health_pb2.WorkerHealth) -> dict[str, Any]:
    return {
        "worker": w.worker_id,
        "alive": w.alive,
        "heartbeat_age_ms": w.heartbeat_age_ms,
        "last_active_unix_ms": w.last_active_unix_ms,
        "replicas": w.replicas,
        "queue_depth": w.queue_depth,
        "drained": w.drained,
        "stopping": w.stopping,
    }


def plain_table(*columns: str, header: bool = True) -> Table:
    """A table of ``columns``, each as wide as its content, no borders; fill it with ``add_row``."""
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False, show_header=header)
    for name in columns:
        table.add_column(name, overflow="fold")
    return table


def add_row(table: Table, *cells: str) -> None:
    """Cells as plain text: a bracket in a model's reason or a tensor's values is never rich markup."""
    table.add_row(*(Text(cell) for cell in cells))


def _traffic(doc: dict[str, Any]) -> str:
    t = doc["traffic"]
    if not t["stable"]:
        return "-"
    return t["stable"] + (f" +{t['canary']}@{t['canary_percent']}%" if t["canary"] else "")


def _breaker(doc: dict[str, Any]) -> str:
    b = doc["breaker"]
    if not b["until_unix_ms"]:
        return str(b["level"])
    left = max(0.0, b["until_unix_ms"] / 1000 - time.time())
    return f"{b['level']} ({left:.0f}s left)"


def models_table(models: list[dict[str, Any]]) -> Table:
    """One row per replica (a model with none gets one row): model, version, worker, state, breaker,
    traffic, and a note (why a replica is not RUNNING, why a change is pending)."""
    table = plain_table("MODEL", "VERSION", "WORKER", "STATE", "BREAKER", "TRAFFIC", "NOTE")
    for doc in models:
        first = True
        for r in doc["replicas"] or [None]:
            notes = []
            if first and doc["pending"]:
                notes.append(doc["pending"])
            if r is not None and r["state"] != "RUNNING" and r["reason"]:
                state, reason = r["state"].lower(), r["reason"]
                notes.append(reason if reason.startswith(f"{state}:") else f"{state}: {reason}")
            add_row(
                table,
                doc["model"],
                r["version"] if r else "-",
                r["worker"] if r else "-",
                r["state"] if r else "-",
                _breaker(doc) if first else "",
                _traffic(doc) if first else "",
                "; ".join(notes),
            )
            first = False
    return table


def summary_table(models: list[dict[str, Any]]) -> Table:
    """One row per model: state, versions, replicas RUNNING of wanted, traffic, breaker, pending."""
    table = plain_table("MODEL", "STATE", "VERSIONS", "RUNNING", "TRAFFIC", "BREAKER", "PENDING")
    for doc in models:
        add_row(
            table,
            doc["model"],
            doc["state"],
            ",".join(doc["versions"]) or "-",
            f"{doc['replicas_running']}/{doc['replicas_wanted']}",
            _traffic(doc),
            _breaker(doc),
            doc["pending"],
        )
    return table


def rejections_table(rejections: list[dict[str, Any]]) -> Table:
    """One row per operator document a service rejected: which key, which service, why (its last good
    value stays in force there)."""
    table = plain_table("REJECTED KEY", "SERVICE", "WHY (the last good value stays)")
    for r in rejections:
        add_row(table, r["key"], f"{r['service']} {r['instance']}", r["reason"])
    return table


def workers_table(workers: list[dict[str, Any]]) -> Table:
    table = plain_table("WORKER", "ALIVE", "HEARTBEAT AGE", "REPLICAS", "QUEUE", "NOTE")
    for w in workers:
        note = f"drained: {w['drained']}" if w["drained"] else "stopping (SIGTERM)" if w["stopping"] else ""
        add_row(
            table,
            w["worker"],
            str(w["alive"]).lower(),
            f"{w['heartbeat_age_ms'] / 1000:.1f}s",
            str(w["replicas"]),
            str(w["queue_depth"]),
            note,
        )
    return table
