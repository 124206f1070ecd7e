"""``--processes N``: N router processes on one host behind the same gRPC and REST ports.

Invariants:
- The processes share nothing but etcd and the ports: the kernel spreads new connections over them
  (``SO_REUSEPORT``; grpc sets it on Linux, the REST server is told to). Each is a whole router with its
  own id (``<router_id>-<i>``), so its own stats lease and keys, its own ZeroMQ links and correlation
  prefix, and its own metrics port (``metrics_port + i``; each its own when ``metrics_port`` is 0).
- A port given as 0 is chosen here once, held (bound with ``SO_REUSEPORT``, never listening) until every
  process is ready, so all of them bind the same one.
- One ready line, once all are ready: the shared ``grpc`` and ``rest`` addresses, the first process's
  ``metrics``, and every process's id, pid and metrics address under ``processes``.
- A process that exits while the supervisor is not stopping is started again under the same index (and
  id) after 1 s, doubling up to 30 s while it keeps dying within 10 s of its start; SIGTERM/SIGINT go to
  every process, and the supervisor exits once they have (their own graceful stop: notice period,
  drain, etcd), killing any that outlive that budget. A process gets SIGTERM when its supervisor dies.
- What a router keeps in memory stays per process: sequences are pinned by the process that saw their
  start (a sequence's requests belong on one connection), and the per-worker bounds
  (``max_in_flight_per_worker``, bounded loads) count that process's requests only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from mcp_router.config import RouterConfig
from mcpcore.serving import advertised_host

__all__ = ["supervise"]

log = logging.getLogger(__name__)
_READY_TIMEOUT_S = 60.0
_RESTART_GAP_S = 1.0  # a process that exits is started again after at least this, doubling ...
_RESTART_MAX_GAP_S = 30.0  # ... up to this while it keeps exiting within _QUICK_EXIT_S of its start
_QUICK_EXIT_S = 10.0
_PR_SET_PDEATHSIG = 1


@dataclass
class _Child:
    index: int
    router_id: str
    args: list[str]
    proc: subprocess.Popen[str] | None = None
    started: float = 0.0
    ready: dict[str, Any] = field(default_factory=dict)

    quick_exits: int = 0  # exits in a row soon after a start: the restart backs off

    def start(self, *, again: bool = False) -> None:
        """Start it; a restart's ready line is not read (nothing waits for it). It gets SIGTERM when
        the supervisor dies, however it dies (no orphan keeps serving the port)."""
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.DEVNULL if again else subprocess.PIPE, text=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509  (the supervisor runs no threads)
        )  # fmt: skip


def _die_with_parent() -> None:  # in the child, before exec (the supervisor runs no threads)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _reserve(host: str, port: int) -> tuple[int, socket.socket | None]:
    """``port``, or (0) a free one held bound with SO_REUSEPORT so that nothing else takes it."""
    if port != 0:
        return port, None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock.getsockname()[1], sock


def supervise(config: RouterConfig, argv: list[str]) -> int:
    """Run ``config.processes`` routers (``argv``: the flags this process got, which each one gets too)."""
    n = config.processes
    held: list[socket.socket] = []
    grpc_port, sock = _reserve(config.grpc.host, config.grpc.port)
    held += [sock] if sock else []
    rest_port = config.rest_port
    if rest_port >= 0:
        rest_port, sock = _reserve(config.rest_host, rest_port)
        held += [sock] if sock else []
    children = []
    for i in range(n):
        router_id = f"{config.router_id}-{i}"
        metrics_port = config.metrics.port + i if config.metrics.port else 0
        args = [
            sys.executable, "-m", "mcp_router", *argv, "--processes", "1", "--reuse-port",
            "--router-id", router_id, "--grpc-port", str(grpc_port), "--rest-port", str(rest_port),
            "--metrics-port", str(metrics_port),
        ]  # fmt: skip
        children.append(_Child(i, router_id, args))
    stopping: list[int] = []

    def kill_rest(_signum: int, _frame: Any) -> None:
        for child in children:
            if child.proc is not None and child.proc.returncode is None:
                log.error("router process %s outlived its drain; killing it", child.router_id)
                with contextlib.suppress(ProcessLookupError):
                    child.proc.kill()

    def stop(signum: int, _frame: Any) -> None:
        if not stopping:  # their own graceful stop, then whatever outlives it is killed
            signal.signal(signal.SIGALRM, kill_rest)
            # a router's stop: its notice period, its drain, then its etcd calls (lease, stats)
            budget = config.shutdown_delay_s + config.drain_timeout_s + 2 * config.etcd.timeout_s + 5
            signal.alarm(int(budget))
        stopping.append(signum)
        for child in children:
            if child.proc is not None and child.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for child in children:
            child.start()
        ready = _await_ready(children, stopping)
    except BaseException:  # whatever went wrong, no router is left running without its supervisor
        log.exception("starting the router processes failed")
        ready = False
    finally:
        for sock in held:  # every process has bound the ports (or is gone): nothing needs the hold
            sock.close()
    if not ready:
        stop(signal.SIGTERM, None)
        _reap(children, stopping)
        return 1
    first = children[0].ready
    host = advertised_host(config.grpc.host, config.advertise.host)
    ready = {
        "event": "ready", "router_id": config.router_id, "grpc": f"{host}:{grpc_port}",
        "metrics": first.get("metrics", ""),
        "processes": [  # as started (one started again keeps its id, and its metrics port unless 0)
            {"router_id": c.router_id, "pid": c.ready.get("pid", 0), "metrics": c.ready.get("metrics", "")}
            for c in children
        ],
    }  # fmt: skip
    if rest_port >= 0:
        ready["rest"] = f"{advertised_host(config.rest_host, config.advertise.host)}:{rest_port}"
    print(json.dumps(ready), flush=True)
    log.info("serving with %d router processes on gRPC port %d", n, grpc_port)
    return _reap(children, stopping)


def _reap(children: list[_Child], stopping: list[int]) -> int:
    """Wait for the processes (blocking on the kernel: a signal's handler runs meanwhile); start again
    one that exits while not stopping. Returns once none is left: 0, or 1 if one failed its stop."""
    by_pid = {c.proc.pid: c for c in children if c.proc is not None}
    failed = False
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # none left
            return 1 if failed else 0
        child = by_pid.pop(pid, None)
        if child is None or child.proc is None:
            continue
        child.proc.returncode = code = os.waitstatus_to_exitcode(status)
        if stopping:
            failed = failed or code not in (0, -signal.SIGTERM)
            continue
        quick = time.monotonic() - child.started < _QUICK_EXIT_S
        child.quick_exits = child.quick_exits + 1 if quick else 0
        gap = min(_RESTART_MAX_GAP_S, _RESTART_GAP_S * 2 ** max(0, child.quick_exits - 1))
        log.error("router process %s exited (%s); starting it again in %.0f s", child.router_id, code, gap)
        time.sleep(gap)  # a backoff, not a wait for anything: one that keeps dying is not spun
        if stopping:
            continue
        if child.proc.stdout is not None:
            child.proc.stdout.close()
        child.start(again=True)
        by_pid[child.proc.pid] = child
        if stopping:  # the signal came while it started: it gets its SIGTERM too
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)


def _await_ready(children: list[_Child], stopping: list[int]) -> bool:
    """Read every process's ready line; False if one exits first, a signal comes, or time runs out."""
    sel = selectors.DefaultSelector()
    waiting = {}
    for child in children:
        assert child.proc is not None and child.proc.stdout is not None
        sel.register(child.proc.stdout, selectors.EVENT_READ, child)
        waiting[child.index] = child
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while waiting and not stopping:
        left = deadline - time.monotonic()
        if left <= 0:
            log.error("router processes %s not ready in %.0f s", sorted(waiting), _READY_TIMEOUT_S)
            return False
        for key, _ in sel.select(min(left, 0.5)):
            child = key.data
            line = key.fileobj.readline()  # type: ignore[union-attr]
            if not line:
                log.error("router process %s exited before it was ready", child.router_id)
                return False
            child.ready = json.loads(line)
            sel.unregister(key.fileobj)
            del waiting[child.index]
    return not waiting
