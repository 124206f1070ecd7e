"""``mcpctl`` control-plane commands, over the scheduler's ``mcpapi.v2.ModelControl`` and the health
service's ``Health``: status, list, load, unload, pause, resume, traffic, breaker, drain, undrain.

Each command makes its request, prints the result (``views``: a table, or one JSON document with
``-o json``) and raises on failure; ``mcpctl.main`` prints the one-line error and picks the exit code.
``status_table`` is the status as text, for ``python -m mcp_devcluster`` (``make up``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from mcpapi.v2 import control_pb2, health_pb2, model_pb2
from mcpclient.config import client_environment
from mcpclient.ctlkit import (
    Ctl,
    connects,
    output_option,
    pass_ctl,
    prefix_option,
    render_text,
    write_renderables,
)
from mcpclient.load_progress import load_and_wait
from mcpclient.views import (
    breaker_doc,
    model_doc,
    models_table,
    rejections_table,
    summary_table,
    worker_doc,
    workers_table,
)
from mcpcore.errors import InvalidArgument, MCPError
from mcpcore.etcd_store import EtcdAuth, EtcdStore
from mcpcore.keys import Keyspace
from mcpcore.records import RejectionsDoc
from mcpcore.tls import TLSConfig

__all__ = ["COMMANDS", "status_doc", "status_table"]

LOAD_TIMEOUT_S = 60.0


# --- status, list ------------------------------------------------------------------------------------------
def status_doc(ctl: Ctl, prefix: str = "/mcp") -> dict[str, Any]:
    """Every model (scheduler), then every worker (health service), then every operator document a service
    rejected (etcd, ``<prefix>/rejected/``). A health service or an etcd that does not answer leaves
    ``workers`` or ``rejections`` null and says why in ``health_error`` or ``rejections_error`` (the rest
    is still worth showing)."""
    models = ctl.call("scheduler", "ListModels", control_pb2.ListModelsRequest(), timeout=10).models
    doc: dict[str, Any] = {"models": [model_doc(m) for m in models], "workers": None, "health_error": ""}
    try:
        report = ctl.call("health", "ClusterHealth", health_pb2.ClusterHealthRequest(), timeout=5)
    except MCPError as err:
        doc["health_error"] = f"health service at {ctl.health} did not answer ({err.code.name})"
    else:
        doc["workers"] = [worker_doc(w) for w in report.workers]
    doc["rejections"], doc["rejections_error"] = None, ""
    if ctl.etcd:
        try:
            doc["rejections"] = asyncio.run(_rejections(ctl.etcd, ctl.etcd_auth, Keyspace(prefix)))
        except MCPError as err:
            doc["rejections_error"] = f"etcd at {ctl.etcd} did not answer ({err.message})"
    return doc


async def _rejections(etcd: str, auth: EtcdAuth | None, keys: Keyspace) -> list[dict[str, Any]]:
    """What every service instance published under ``/mcp/rejected/`` (records.RejectionsDoc)."""
    endpoints = [e.strip() for e in etcd.split(",") if e.strip()]
    async with EtcdStore(endpoints, timeout=3.0, auth=auth) as store:
        items = (await store.get_prefix(keys.rejected_prefix())).items
    out = []
    for kv in items:
        try:
            published = RejectionsDoc.parse(kv.key, kv.value)
        except InvalidArgument as err:
            out.append(
                {"key": kv.key, "service": "?", "instance": "", "kind": "", "reason": err.message, "at": 0}
            )
            continue
        out.extend(
            {"key": r.key, "service": published.service, "instance": published.instance, "kind": r.kind,
             "reason": r.reason, "at": r.at}
            for r in published.rejections
        )  # fmt: skip
    return sorted(out, key=lambda r: (r["key"], r["service"], r["instance"]))


def _status_view(doc: dict[str, Any]) -> list[RenderableType]:
    if doc["workers"] is None:
        tail: RenderableType = Text(f"({doc['health_error']})")
    else:
        tail = workers_table(doc["workers"])
    view = [models_table(doc["models"]), Text(""), tail]
    if doc.get("rejections"):
        view += [Text(""), rejections_table(doc["rejections"])]
    elif doc.get("rejections_error"):
        view += [Text(""), Text(f"(rejected documents unknown: {doc['rejections_error']})")]
    return view


def status_table(scheduler: str, health: str, tls: TLSConfig | None = None) -> str:
    """The status as plain text (models, then workers), for the launcher's closing lines."""
    ctl = Ctl(scheduler=scheduler, router="", health=health, etcd="", tls=tls)
    try:
        return render_text(_status_view(status_doc(ctl)))
    finally:
        ctl.close()


@click.command(name="status")
@click.option(
    "--watch",
    type=click.FloatRange(min=0.1),
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="redraw every SECONDS (default 2) until Ctrl-C; with -o json, one document per line per refresh",
)
@prefix_option(" (where services publish the documents they rejected)")
@connects("scheduler", "health", "etcd")
@output_option
@pass_ctl
def status_cmd(ctl: Ctl, watch: float | None, prefix: str) -> None:
    """Models, versions, replicas, states, breakers and traffic; then workers (from the health service);
    then every operator document a service rejected (etcd): which key, which service, why."""
    try:
        Keyspace(prefix)
    except InvalidArgument as err:
        raise click.BadParameter(err.message, param_hint="--prefix") from None
    if watch is None:
        doc = status_doc(ctl, prefix)
        ctl.emit(doc, lambda: _status_view(doc))
        return
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a watch ends: a success
        _watch(ctl, watch, prefix)


def _frame(ctl: Ctl, prefix: str) -> tuple[dict[str, Any], list[RenderableType]]:
    try:
        doc = status_doc(ctl, prefix)
    except MCPError as err:  # the scheduler may come back: keep watching, say so
        doc = {"error": err.message}
        return doc, [Text(f"(no status: {err.message})")]
    return doc, _status_view(doc)


def _watch(ctl: Ctl, interval: float, prefix: str) -> None:
    console = Console(file=sys.stdout)
    if ctl.json or not console.is_terminal:  # a pipe or file: one frame after the other
        while True:
            doc, view = _frame(ctl, prefix)
            if ctl.json:
                click.echo(json.dumps({**doc, "at": time.time()}))
            else:
                write_renderables([*view, Text("")])
            sys.stdout.flush()
            time.sleep(interval)  # the refresh period the operator asked for

    def screen() -> Group:
        header = Text(f"every {interval:g}s, Ctrl-C to stop    {time.strftime('%H:%M:%S')}", style="dim")
        return Group(header, *_frame(ctl, prefix)[1])

    with Live(screen(), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            live.update(screen(), refresh=True)


@click.command(name="list")
@connects("scheduler")
@output_option
@pass_ctl
def list_cmd(ctl: Ctl) -> None:
    """The models only: one row each (state, versions, replicas RUNNING of wanted, traffic, breaker)."""
    models = ctl.call("scheduler", "ListModels", control_pb2.ListModelsRequest(), timeout=10).models
    docs = [model_doc(m) for m in models]
    ctl.emit({"models": docs}, lambda: summary_table(docs))


# --- load, unload, pause, resume ---------------------------------------------------------------------------
@click.command(name="load")
@click.argument("model")
@click.option("--version", "versions", multiple=True, metavar="V", help="a version; repeat for several [1]")
@click.option("--replicas", type=click.IntRange(min=0), default=1, show_default=True, help="per version")
@click.option("--max-replicas", type=click.IntRange(min=0), default=0, help="autoscaling ceiling")
@click.option("--priority", type=click.IntRange(min=0), default=0, help="placement priority")
@click.option("--memory-bytes", type=click.IntRange(min=0), default=0, help="memory each replica needs")
@click.option("--fallback", default="", metavar="V", help="the version breaker level 3 falls back to")
@click.option("--on-demand", is_flag=True, help="load only when a request asks for it")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=LOAD_TIMEOUT_S,
    show_default=True,
    help="seconds to wait for RUNNING (exit 4 after that; the load goes on)",
)
@connects("scheduler")
@output_option
@pass_ctl
def load_cmd(ctl: Ctl, model: str, versions: tuple[str, ...], timeout: float, **opts: Any) -> None:
    """Load a model and show its progress until every wanted replica is RUNNING."""
    spec = model_pb2.ModelSpec(
        model=model,
        versions=list(versions) or ["1"],
        replicas=opts["replicas"],
        max_replicas=opts["max_replicas"],
        priority=opts["priority"],
        fallback_version=opts["fallback"],
        load_on_demand=opts["on_demand"],
        placement=model_pb2.PlacementConstraints(memory_bytes=opts["memory_bytes"]),
    )
    doc = model_doc(load_and_wait(ctl, spec, timeout))
    ctl.emit(doc, lambda: [models_table([doc]), Text(_running_line(doc))])


def _running_line(doc: dict[str, Any]) -> str:
    return f"{doc['model']}: {doc['replicas_running']}/{doc['replicas_wanted']} replica(s) RUNNING"


def _model_version_command(
    name: str, method: str, request: Any, *, verb: str, help_: str, version_help: str
) -> click.Command:
    """unload, pause and resume: MODEL [--version V], one scheduler call (without --version it covers every
    version). Prints the whole model as it stands after it: the reply covers only the version asked for,
    so with --version the model is read again."""

    @click.command(name=name, help=help_)
    @click.argument("model")
    @click.option("--version", default="", metavar="V", help=version_help)
    @connects("scheduler")
    @output_option
    @pass_ctl
    def command(ctl: Ctl, model: str, version: str) -> None:
        status = ctl.call("scheduler", method, request(model=model, version=version), LOAD_TIMEOUT_S).status
        doc = {**model_doc(_model_status(ctl, model) if version else status), "model": model}
        ctl.emit(doc, lambda: Text(f"{model}{'/' + version if version else ''}: {verb}"))

    return command


def _model_status(ctl: Ctl, model: str) -> model_pb2.ModelStatus:
    return ctl.call("scheduler", "GetModelStatus", control_pb2.GetModelStatusRequest(model=model), 10).status


unload_cmd = _model_version_command(
    "unload", "UnloadModel", control_pb2.UnloadModelRequest, verb="unloaded",
    help_="Unload a model, or one version of it (its replicas drain first).",
    version_help="only this version (default: the whole model)",
)  # fmt: skip
pause_cmd = _model_version_command(
    "pause", "PauseModel", control_pb2.PauseModelRequest, verb="paused",
    help_="Pause a model (RUNNING -> PAUSED: replicas keep their memory and take no new requests).",
    version_help="only this version (default: all)",
)  # fmt: skip
resume_cmd = _model_version_command(
    "resume", "ResumeModel", control_pb2.ResumeModelRequest, verb="running again",
    help_="Resume a paused model (PAUSED -> RUNNING).", version_help="only this version (default: all)",
)  # fmt: skip


# --- traffic, breaker --------------------------------------------------------------------------------------
@click.command(name="traffic")
@click.argument("model")
@click.argument("stable")
@click.option("--canary", default="", metavar="V", help="a canary version (with --percent)")
@click.option("--percent", type=click.IntRange(0, 100), default=None, help="the canary's share, 0-100")
@connects("scheduler")
@output_option
@pass_ctl
def traffic_cmd(ctl: Ctl, model: str, stable: str, canary: str, percent: int | None) -> None:
    """Set the traffic split: the STABLE version, optionally a canary and its percent."""
    if bool(canary) != (percent is not None):
        raise click.UsageError("--canary V and --percent P go together (e.g. --canary 2 --percent 10)")
    split = model_pb2.TrafficSplit(stable=stable, canary=canary, canary_percent=percent or 0)
    reply = ctl.call("scheduler", "SetTraffic", control_pb2.SetTrafficRequest(model=model, traffic=split))
    t = reply.traffic
    split_doc = {"stable": t.stable, "canary": t.canary, "canary_percent": t.canary_percent}
    doc = {"model": model, "traffic": split_doc, "pending": reply.pending}
    ctl.emit(
        doc,
        lambda: Text(f"{model}: traffic set" + (f" ({reply.pending})" if reply.pending else " and in force")),
    )


class _BreakerGroup(click.Group):
    """``breaker MODEL LEVEL ...`` (the README's form) is ``breaker set MODEL LEVEL ...``: a first
    argument that is not a subcommand is a model name. (So a model named set, get or clear needs the
    explicit form.)"""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["set", *args]
        return super().parse_args(ctx, args)


@click.group(name="breaker", cls=_BreakerGroup)
def breaker_cmd() -> None:
    """A model's circuit breaker: set (force a level), clear (drop the override), get.
    `mcpctl breaker MODEL LEVEL` is `mcpctl breaker set MODEL LEVEL`."""


def _emit_breaker(ctl: Ctl, model: str, state: model_pb2.BreakerState, note: str = "") -> None:
    doc = {"model": model, **breaker_doc(state)}
    until = f", until {time.strftime('%H:%M:%S', time.localtime(state.until_unix_ms / 1000))}"
    line = f"{model}: breaker level {state.level}" + (until if state.until_unix_ms else "")
    line += f" ({state.reason}; set by {state.set_by})" if state.reason else ""
    ctl.emit(doc, lambda: Text(line + note))


@breaker_cmd.command(name="set")
@click.argument("model")
@click.argument("level", type=click.IntRange(0, 3), required=False, metavar="LEVEL")
@click.option(
    "--for-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="expire the forced level after this long (default: until cleared)",
)
@click.option(
    "--reason", default="forced with mcpctl", show_default=True, help="why (shown in status, alerts)"
)
@connects("scheduler")
@output_option
@pass_ctl
def breaker_set(ctl: Ctl, model: str, level: int | None, for_seconds: float | None, reason: str) -> None:
    """Force MODEL's breaker to LEVEL (0 normal .. 3 static fallback)."""
    if level is None:
        raise click.UsageError(
            f"LEVEL is missing: say which level to force, 0-3 (e.g. `mcpctl breaker set {model} 3`); "
            f"`mcpctl breaker clear {model}` drops a forced level"
        )
    request = control_pb2.SetBreakerRequest(model=model, level=level, reason=reason)
    request.until_unix_ms = int((time.time() + for_seconds) * 1000) if for_seconds else 0
    request.set_by = client_environment().user
    _emit_breaker(ctl, model, ctl.call("scheduler", "SetBreaker", request).breaker)


@breaker_cmd.command(name="clear")
@click.argument("model")
@connects("scheduler")
@output_option
@pass_ctl
def breaker_clear(ctl: Ctl, model: str) -> None:
    """Drop an operator's forced level: the health service's level applies again at once."""
    request = control_pb2.SetBreakerRequest(model=model, clear=True, reason="cleared by mcpctl")
    _emit_breaker(ctl, model, ctl.call("scheduler", "SetBreaker", request).breaker, " (override cleared)")


@breaker_cmd.command(name="get")
@click.argument("model")
@connects("scheduler")
@output_option
@pass_ctl
def breaker_get(ctl: Ctl, model: str) -> None:
    """The breaker level in force and where it came from."""
    _emit_breaker(
        ctl, model, ctl.call("scheduler", "GetBreaker", control_pb2.GetBreakerRequest(model=model)).breaker
    )


# --- drain, undrain ----------------------------------------------------------------------------------------
@click.command(name="drain")
@click.argument("worker")
@click.option("--reason", default="drained by mcpctl", show_default=True, help="why (shown in status)")
@connects("scheduler")
@output_option
@pass_ctl
def drain_cmd(ctl: Ctl, worker: str, reason: str) -> None:
    """Move every replica off WORKER and place nothing new on it (until undrain)."""
    moving = ctl.call(
        "scheduler", "Drain", control_pb2.DrainRequest(worker_id=worker, reason=reason)
    ).replicas
    names = ", ".join(f"{r.model}/{r.version}" for r in moving) or "none"
    doc = {
        "worker": worker,
        "reason": reason,
        "moving": [{"model": r.model, "version": r.version} for r in moving],
    }
    ctl.emit(doc, lambda: Text(f"{worker}: drained ({reason}); replicas moving away: {names}"))


@click.command(name="undrain")
@click.argument("worker")
@connects("scheduler")
@output_option
@pass_ctl
def undrain_cmd(ctl: Ctl, worker: str) -> None:
    """End WORKER's drain: it takes new replicas again."""
    was = ctl.call("scheduler", "Undrain", control_pb2.UndrainRequest(worker_id=worker)).reason
    ctl.emit(
        {"worker": worker, "was": was},
        lambda: Text(f"{worker}: no longer drained" + (f" (was: {was})" if was else "")),
    )


COMMANDS = (
    status_cmd,
    list_cmd,
    load_cmd,
    unload_cmd,
    pause_cmd,
    resume_cmd,
    traffic_cmd,
    breaker_cmd,
    drain_cmd,
    undrain_cmd,
)
