"""``mcpctl load``'s wait: LoadModel runs in the background (a gRPC future) while GetModelStatus is polled
to draw each version's replicas on their way to RUNNING (a rich progress display on stderr).

Invariants:
- LoadModel's answer decides the outcome; the polls only draw. It returns once every wanted replica is
  RUNNING and the model is routed, or fails with the scheduler's error (exit 1).
- DEADLINE_EXCEEDED is a timed-out load (``Failure``, exit 4) only when the scheduler still answers a
  GetModelStatus afterwards; otherwise the scheduler could not be reached (exit 3). Either way the spec
  stays recorded and the load goes on in the background, and the message says so.
- Ctrl-C cancels the wait, not the load (exit 130).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import grpc
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from mcpapi.v2 import control_pb2, model_pb2
from mcpclient.ctlkit import EXIT_INTERRUPTED, EXIT_TIMED_OUT, Ctl, Failure
from mcpcore.errors import DeadlineExceeded, MCPError, NotFound

__all__ = ["load_and_wait"]

POLL_S = 0.25  # how often the display is refreshed from GetModelStatus


def load_and_wait(ctl: Ctl, spec: model_pb2.ModelSpec, timeout: float) -> model_pb2.ModelStatus:
    """LoadModel ``spec`` with a ``timeout`` deadline; the status LoadModel answered, once every wanted
    replica is RUNNING. A terminal on stderr shows the progress meanwhile (not with ``-o json``; a pipe or
    log gets only the outcome)."""
    future = ctl.stub("scheduler").LoadModel.future(control_pb2.LoadModelRequest(spec=spec), timeout=timeout)
    console = Console(stderr=True)
    display = _Display(spec, console, enabled=console.is_terminal and not ctl.json)
    try:
        with display:
            while True:
                try:
                    status = future.result(timeout=POLL_S).status
                except grpc.FutureTimeoutError:
                    if (polled := _poll(ctl, spec.model)) is not None:
                        display.update(polled)
                    continue
                display.update(status)  # the last frame shows the answer
                return status
    except KeyboardInterrupt:
        future.cancel()
        raise Failure(
            f"interrupted; the load of {spec.model} goes on in the background (see `mcpctl status`)",
            EXIT_INTERRUPTED,
        ) from None
    except grpc.RpcError as err:
        raise _load_error(ctl, spec, timeout, ctl.rpc_error("scheduler", err)) from None


def _poll(ctl: Ctl, model: str) -> model_pb2.ModelStatus | None:
    try:
        return ctl.call(
            "scheduler", "GetModelStatus", control_pb2.GetModelStatusRequest(model=model), 5
        ).status
    except NotFound:
        return None  # the spec is not recorded yet
    except MCPError:
        return None  # drawing is best effort; LoadModel's own answer decides


def _load_error(ctl: Ctl, spec: model_pb2.ModelSpec, timeout: float, err: MCPError) -> Exception:
    if not isinstance(err, DeadlineExceeded):
        return err
    try:
        status = ctl.call(
            "scheduler", "GetModelStatus", control_pb2.GetModelStatusRequest(model=spec.model), timeout=5
        ).status
    except NotFound:
        status = model_pb2.ModelStatus(model=spec.model)
    except MCPError:
        return err  # the scheduler does not answer: a service that could not be reached
    running = sum(1 for r in status.replicas if r.state == model_pb2.RUNNING)
    wanted = spec.replicas * len(spec.versions)
    pending = f"; pending: {status.pending}" if status.pending else ""
    return Failure(
        f"{spec.model}: {running}/{wanted} replica(s) RUNNING after {timeout:g}s{pending}; "
        "the load goes on in the background (see `mcpctl status`)",
        EXIT_TIMED_OUT,
    )


class _Display:
    """One progress bar per version: RUNNING replicas of the wanted count, and the others' states."""

    def __init__(self, spec: model_pb2.ModelSpec, console: Console, *, enabled: bool) -> None:
        self._spec = spec
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.fields[name]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[states]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
        )
        self._tasks = {
            v: self._progress.add_task("", total=spec.replicas, name=f"{spec.model}/{v}", states="waiting")
            for v in spec.versions
        }

    def __enter__(self) -> _Display:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: Any) -> None:
        if exc_type is not None:  # a failure is one line on stderr: no last frame above it
            self._progress.live.transient = True
        self._progress.stop()

    def update(self, status: model_pb2.ModelStatus) -> None:
        for version, task in self._tasks.items():
            replicas = [r for r in status.replicas if r.version == version]
            states = Counter(model_pb2.ModelState.Name(r.state) for r in replicas)
            running = states.pop("RUNNING", 0)
            words = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
            if status.pending:
                words = f"{words}; {status.pending}" if words else status.pending
            self._progress.update(task, completed=running, states=words)
