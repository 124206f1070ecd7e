"""``mcpctl`` commands for looking inside a running cluster: dump (etcd and every router's routing table, as
JSON) and profile (a py-spy flamegraph of one service process).

Invariants:
- ``dump`` only reads. A router that does not answer its ``/debug/snapshot`` is listed with the error,
  and the rest of the dump is still written; only an etcd that cannot be read fails the command (exit 3).
- ``profile`` finds a service's pid in the pid files ``python -m mcp_devcluster up`` writes
  (``.run/<SERVICE>.pid``), or takes ``--pid``; a missing pid file is a usage error (2), a process that is
  gone or a py-spy that is missing or fails is exit 1, each one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
from rich.text import Text

from mcpclient.ctlkit import Ctl, Failure, connects, pass_ctl, prefix_option
from mcpcore.errors import InvalidArgument
from mcpcore.etcd_store import EtcdAuth, EtcdStore
from mcpcore.keys import Keyspace, check_name
from mcpcore.records import RouterRecord, display
from mcpcore.store import Range

__all__ = ["COMMANDS"]

SNAPSHOT_PATH = "/debug/snapshot"
SNAPSHOT_TIMEOUT_S = 5.0


# --- dump --------------------------------------------------------------------------------------------------
async def _read(endpoints: list[str], prefix: str, auth: EtcdAuth | None) -> Range:
    async with EtcdStore(endpoints, timeout=5.0, auth=auth) as store:
        return await store.get_prefix(prefix)


def _snapshot(key: str, raw: bytes) -> dict[str, Any]:
    """A router's presence record with its snapshot, or with the error that stood in the way."""
    record = display(key, raw)
    try:
        metrics = RouterRecord.parse(key, raw).metrics
    except InvalidArgument as err:
        return {"record": record, "error": err.message}
    if not metrics:
        return {"record": record, "error": "its record names no metrics address"}
    url = f"http://{metrics}{SNAPSHOT_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=SNAPSHOT_TIMEOUT_S) as resp:
            return {"record": record, "snapshot": json.loads(resp.read())}
    except urllib.error.HTTPError as exc:
        return {"record": record, "error": f"{url}: HTTP {exc.code} {exc.reason}"}
    except (OSError, ValueError) as exc:  # refused, timed out, not JSON
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return {"record": record, "error": f"{url}: no snapshot ({reason})"}


@click.command(name="dump")
@prefix_option("")
@connects("etcd")
@pass_ctl
def dump_cmd(ctl: Ctl, prefix: str) -> None:
    """Everything the cluster keeps in etcd, and every router's routing table, as one JSON document.

    Every key under PREFIX (values decoded as JSON where they parse), and for each router that publishes
    PREFIX/routers/<id>, the snapshot its metrics port serves at /debug/snapshot. Always JSON.
    """
    try:
        keys = Keyspace(prefix)
    except InvalidArgument as err:
        raise click.BadParameter(err.message, param_hint="--prefix") from None
    endpoints = [e.strip() for e in ctl.etcd.split(",") if e.strip()]
    items = asyncio.run(_read(endpoints, f"{prefix}/", ctl.etcd_auth))
    values = {kv.key: display(kv.key, kv.value) for kv in items.items}
    routers = {
        kv.key.removeprefix(keys.routers_prefix()): (kv.key, kv.value)
        for kv in items.items
        if kv.key.startswith(keys.routers_prefix())
    }
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(routers)))) as pool:
        found = pool.map(lambda kv: _snapshot(*kv), routers.values())
        snapshots = dict(zip(routers, found, strict=True))
    doc = {
        "etcd": {"endpoints": endpoints, "prefix": prefix, "revision": items.revision, "keys": values},
        "routers": snapshots,
    }
    click.echo(json.dumps(doc, indent=2))


# --- profile -----------------------------------------------------------------------------------------------
def _pid_of(service: str | None, pid: int | None, run_dir: Path) -> tuple[str, int]:
    if pid is not None:
        return (f"{service} (pid {pid})" if service else f"pid {pid}"), pid
    if service is None:
        raise click.UsageError("name a SERVICE (its pid is read from RUN_DIR/SERVICE.pid) or give --pid PID")
    try:
        check_name(service, "service name")
    except InvalidArgument as err:
        raise click.BadParameter(err.message, param_hint="SERVICE") from None
    path = run_dir / f"{service}.pid"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in run_dir.glob("*.pid"))) or "none"
        raise click.BadParameter(
            f"no pid file {path} (pid files there: {known}); is the local cluster up? or give --pid",
            param_hint="SERVICE",
        )
    text = path.read_text().strip()
    if not text.isdigit():
        raise Failure(f"{path} holds {text[:40]!r}, not a process id")
    return f"{service} (pid {text})", int(text)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: py-spy will say whether it may attach
    return True


def _py_spy(given: str | None) -> str:
    if given is not None:
        found = shutil.which(given)
    else:
        beside = Path(sys.executable).parent / "py-spy"  # the venv's, when mcpctl runs from one
        found = str(beside) if beside.is_file() else shutil.which("py-spy")
    if found is None:
        raise Failure(f"py-spy not found ({given or 'beside this Python or on PATH'}); pip install py-spy")
    return found


def _py_spy_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("Error: ") for line in lines if line.startswith("Error:")]
    return (errors or lines or ["no output"])[0]


@click.command(name="profile")
@click.argument("service", required=False)
@click.option(
    "--pid", type=click.IntRange(min=1), default=None, help="the process to profile [RUN_DIR/SERVICE.pid]"
)
@click.option(
    "--duration", type=click.IntRange(min=1), default=10, show_default=True, help="seconds to sample"
)
@click.option(
    "--output",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="the flamegraph SVG to write [profile-SERVICE.svg]",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".run"),
    show_default=True,
    help="the pid files of `python -m mcp_devcluster up`",
)
@click.option(
    "--py-spy", "py_spy", default=None, metavar="PATH", help="py-spy [beside this Python, else on PATH]"
)
@click.option("--nonblocking", is_flag=True, help="do not pause the process while sampling (less accurate)")
@pass_ctl
def profile_cmd(
    ctl: Ctl,
    service: str | None,
    *,
    pid: int | None,
    duration: int,
    out: Path | None,
    run_dir: Path,
    py_spy: str | None,
    nonblocking: bool,
) -> None:
    """Sample a service process with py-spy for --duration seconds and write a flamegraph SVG.

    SERVICE is a name from the local cluster's pid files (worker-1, scheduler, router, health, ...).
    Attaching needs ptrace rights: root, or the process's own user where ptrace_scope allows it.
    """
    name, target = _pid_of(service, pid, run_dir)
    if not _alive(target):
        raise Failure(f"{name}: no such process (not running any more?)")
    exe = _py_spy(py_spy)
    out = out or Path(f"profile-{service or target}.svg")
    command = [
        exe,
        "record",
        "--pid",
        str(target),
        "--duration",
        str(duration),
        "--output",
        str(out),
        "--format",
        "flamegraph",
        *(["--nonblocking"] if nonblocking else []),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=duration + 60, check=False)
    except subprocess.TimeoutExpired:
        raise Failure(f"py-spy did not finish within {duration + 60}s profiling {name}") from None
    if done.returncode != 0 or not out.is_file():
        raise Failure(f"py-spy could not profile {name}: {_py_spy_error(done.stderr)}")
    doc = {"service": service, "pid": target, "duration_s": duration, "output": str(out)}
    ctl.emit(doc, lambda: Text(f"wrote a {duration}s flamegraph of {name} to {out}"))


COMMANDS = (dump_cmd, profile_cmd)
