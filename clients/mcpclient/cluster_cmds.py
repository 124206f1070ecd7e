"""``mcpctl`` cluster commands: status, load, unload, traffic, breaker, drain, undrain, route, infer.

Each talks to the services over their public gRPC contracts (scheduler, router, health); addresses default
to DESIGN.md section 13's and can be changed with ``--scheduler``, ``--router``, ``--health`` or the
``MCP_SCHEDULER``, ``MCP_ROUTER``, ``MCP_HEALTH`` variables. gRPC errors become ``MCPError``s, which
``mcpctl`` prints as one line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import grpc
import numpy as np

from mcpapi.v2 import (
    control_pb2,
    control_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    model_pb2,
)
from mcpcore import dtypes
from mcpcore.errors import from_rpc_error

__all__ = ["COMMANDS", "status_table"]

TIMEOUT_S = 60.0


def _addresses(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", default=os.environ.get("MCP_SCHEDULER", "127.0.0.1:50051"))
    p.add_argument("--router", default=os.environ.get("MCP_ROUTER", "127.0.0.1:8001"))
    p.add_argument("--health", default=os.environ.get("MCP_HEALTH", "127.0.0.1:50053"))


def _call(method: Any, request: Any, timeout: float = TIMEOUT_S) -> Any:
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as err:
        raise from_rpc_error(err) from None


def _control(args: argparse.Namespace) -> control_pb2_grpc.ModelControlStub:
    return control_pb2_grpc.ModelControlStub(grpc.insecure_channel(args.scheduler))


# --- status ------------------------------------------------------------------------------------------------
def status_table(scheduler: str, health: str | None) -> str:
    """Models, replicas, states and breaker levels; then workers (from the health service, if it answers)."""
    stub = control_pb2_grpc.ModelControlStub(grpc.insecure_channel(scheduler))
    models = _call(stub.ListModels, control_pb2.ListModelsRequest(), 10).models
    lines = [f"{'MODEL':<16}{'VERSION':<9}{'WORKER':<22}{'STATE':<11}{'BREAKER':<9}TRAFFIC / PENDING"]
    for m in models:
        canary = f" +{m.traffic.canary}@{m.traffic.canary_percent}%" if m.traffic.canary else ""
        split = m.traffic.stable + canary
        note = split + (f"  ({m.pending})" if m.pending else "")
        for r in m.replicas or [model_pb2.ReplicaStatus(model=m.model)]:
            state = model_pb2.ModelState.Name(r.state) if r.worker_id else "-"
            where = f"{m.model:<16}{r.version or '-':<9}{r.worker_id or '-':<22}"
            why = f"{state.lower()}: {r.reason}" if r.worker_id and state != "RUNNING" and r.reason else ""
            lines.append(f"{where}{state:<11}{m.breaker.level:<9}{'  '.join(x for x in (note, why) if x)}")
            note = ""
    if health:
        try:
            report = health_pb2_grpc.HealthStub(grpc.insecure_channel(health)).ClusterHealth(
                health_pb2.ClusterHealthRequest(), timeout=5
            )
        except grpc.RpcError:
            lines.append(f"(health service at {health} did not answer)")
        else:
            lines.append("")
            lines.append(f"{'WORKER':<22}{'ALIVE':<7}{'HEARTBEAT AGE':<15}{'REPLICAS':<10}{'QUEUE':<7}NOTE")
            for w in report.workers:
                age = w.heartbeat_age_ms / 1000
                note = f"drained: {w.drained}" if w.drained else "stopping (SIGTERM)" if w.stopping else ""
                lines.append(
                    f"{w.worker_id:<22}{str(w.alive).lower():<7}{age:<15.1f}{w.replicas:<10}{w.queue_depth:<7}{note}"
                )
    return "\n".join(lines)


def _add_status(sub: Any) -> None:
    p = sub.add_parser("status", help="models, replicas, states, breakers and workers")
    _addresses(p)
    p.set_defaults(func=lambda a: print(status_table(a.scheduler, a.health)) or 0)


# --- load / unload -----------------------------------------------------------------------------------------
def cmd_load(args: argparse.Namespace) -> int:
    spec = model_pb2.ModelSpec(
        model=args.model, versions=args.version, replicas=args.replicas, max_replicas=args.max_replicas,
        priority=args.priority, fallback_version=args.fallback or "", load_on_demand=args.on_demand,
        placement=model_pb2.PlacementConstraints(memory_bytes=args.memory_bytes),
    )  # fmt: skip
    status = _call(_control(args).LoadModel, control_pb2.LoadModelRequest(spec=spec), args.timeout).status
    running = sum(1 for r in status.replicas if r.state == model_pb2.RUNNING)
    print(f"{args.model}: {running} replica(s) RUNNING" + (f" ({status.pending})" if status.pending else ""))
    return 0


def _add_load(sub: Any) -> None:
    p = sub.add_parser("load", help="load a model (waits until RUNNING)")
    p.add_argument("model")
    p.add_argument("--version", action="append", default=None, help="repeat for several (default: 1)")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, default=0)
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--memory-bytes", type=int, default=0)
    p.add_argument("--fallback", help="fallback version for breaker level 3")
    p.add_argument("--on-demand", action="store_true", help="load only when a request asks for it")
    p.add_argument("--timeout", type=float, default=TIMEOUT_S)
    _addresses(p)
    p.set_defaults(func=lambda a: cmd_load(argparse.Namespace(**{**vars(a), "version": a.version or ["1"]})))


def _add_unload(sub: Any) -> None:
    p = sub.add_parser("unload", help="unload a model, or one version of it")
    p.add_argument("model")
    p.add_argument("--version", default="")
    _addresses(p)

    def run(a: argparse.Namespace) -> int:
        _call(_control(a).UnloadModel, control_pb2.UnloadModelRequest(model=a.model, version=a.version))
        print(f"{a.model}{'/' + a.version if a.version else ''}: unloaded")
        return 0

    p.set_defaults(func=run)


# --- traffic, breaker --------------------------------------------------------------------------------------
def _add_traffic(sub: Any) -> None:
    p = sub.add_parser("traffic", help="set the split: stable version, optional canary and its percent")
    p.add_argument("model")
    p.add_argument("stable")
    p.add_argument("--canary", default="")
    p.add_argument("--percent", type=int, default=0)
    _addresses(p)

    def run(a: argparse.Namespace) -> int:
        split = model_pb2.TrafficSplit(stable=a.stable, canary=a.canary, canary_percent=a.percent)
        reply = _call(_control(a).SetTraffic, control_pb2.SetTrafficRequest(model=a.model, traffic=split))
        print(f"{a.model}: traffic set" + (f" ({reply.pending})" if reply.pending else " and in force"))
        return 0

    p.set_defaults(func=run)


def _add_breaker(sub: Any) -> None:
    p = sub.add_parser("breaker", help="force a breaker level (0-3), optionally until a time, or --clear")
    p.add_argument("model")
    p.add_argument("level", type=int, nargs="?", default=0)
    p.add_argument("--reason", default="set by mcpctl")
    p.add_argument("--for-seconds", type=float, default=0.0, help="expire the forced level after this long")
    p.add_argument("--clear", action="store_true")
    _addresses(p)

    def run(a: argparse.Namespace) -> int:
        until = int((time.time() + a.for_seconds) * 1000) if a.for_seconds else 0
        request = control_pb2.SetBreakerRequest(model=a.model, level=a.level, reason=a.reason, clear=a.clear)
        request.until_unix_ms, request.set_by = until, os.environ.get("USER", "operator")
        reply = _call(_control(a).SetBreaker, request)
        print(f"{a.model}: breaker level {reply.breaker.level}" + (" (cleared)" if a.clear else ""))
        return 0

    p.set_defaults(func=run)


# --- drain, undrain ----------------------------------------------------------------------------------------
def _add_drain(sub: Any) -> None:
    p = sub.add_parser("drain", help="move every replica off a worker and place nothing new on it")
    p.add_argument("worker")
    p.add_argument("--reason", default="drained by mcpctl")
    _addresses(p)

    def run(a: argparse.Namespace) -> int:
        request = control_pb2.DrainRequest(worker_id=a.worker, reason=a.reason)
        moving = _call(_control(a).Drain, request).replicas
        names = ", ".join(f"{r.model}/{r.version}" for r in moving) or "none"
        print(f"{a.worker}: drained ({a.reason}); replicas moving away: {names}")
        return 0

    p.set_defaults(func=run)


def _add_undrain(sub: Any) -> None:
    p = sub.add_parser("undrain", help="end a worker's drain: it takes new replicas again")
    p.add_argument("worker")
    _addresses(p)

    def run(a: argparse.Namespace) -> int:
        reason = _call(_control(a).Undrain, control_pb2.UndrainRequest(worker_id=a.worker)).reason
        print(f"{a.worker}: no longer drained" + (f" (was: {reason})" if reason else ""))
        return 0

    p.set_defaults(func=run)


# --- route, infer ------------------------------------------------------------------------------------------
def _add_route(sub: Any) -> None:
    p = sub.add_parser("route", help="where a request for a model (and key) would go")
    p.add_argument("model")
    p.add_argument("--key", default="")
    _addresses(p)

    def run(a: argparse.Namespace) -> int:
        stub = inference_pb2_grpc.InferenceStub(grpc.insecure_channel(a.router))
        r = _call(stub.Route, inference_pb2.RouteRequest(model=a.model, routing_key=a.key))
        print(json.dumps({"worker": r.worker_id, "endpoint": r.data_endpoint, "version": r.version,
                          "breaker_level": r.breaker_level}))  # fmt: skip
        return 0

    p.set_defaults(func=run)


def _add_infer(sub: Any) -> None:
    p = sub.add_parser("infer", help="send one request through the router: INPUT0 of --shape, random FP32")
    p.add_argument("model")
    p.add_argument("--version", default="")
    p.add_argument("--key", default="")
    p.add_argument("--shape", default="1,64")
    _addresses(p)

    def run(a: argparse.Namespace) -> int:
        shape = tuple(int(d) for d in a.shape.split(","))
        x = np.random.default_rng(0).random(shape, dtype=np.float32)
        t = inference_pb2.Tensor(
            name="INPUT0", dtype=dtypes.wire_value("FP32"), shape=shape, data=x.tobytes()
        )
        stub = inference_pb2_grpc.InferenceStub(grpc.insecure_channel(a.router))
        request = inference_pb2.InferRequest(model=a.model, version=a.version, routing_key=a.key, inputs=[t])
        reply = _call(stub.Infer, request)
        for out in reply.outputs:
            arr = np.frombuffer(out.data, dtypes.numpy_dtype(dtypes.name_of(out.dtype))).reshape(
                tuple(out.shape)
            )
            head = np.round(arr.reshape(-1)[:4], 4).tolist()
            print(
                f"{reply.model}/{reply.version} on {reply.worker_id}: {out.name} {list(arr.shape)} {head}..."
            )
        return 0

    p.set_defaults(func=run)


COMMANDS = (
    _add_status, _add_load, _add_unload, _add_traffic, _add_breaker, _add_drain, _add_undrain, _add_route,
    _add_infer,
)  # fmt: skip
