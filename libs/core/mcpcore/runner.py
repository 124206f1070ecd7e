"""Running a service process: config from flags > env > YAML, logging, tracing, signals, a "ready" line.

Each service's ``__main__`` is a call to ``main(...)`` with its config class and a factory; the service
object needs ``async start() -> dict`` (its endpoints, printed as one JSON line ``{"event": "ready", ...}``
on stdout, which launchers and tests wait for instead of sleeping) and ``async stop()``.

Besides its config's flags, every service takes the process's own options (``ProcessOptions``; not
config fields, so a service's config says nothing of them):

- ``--log-format json|text`` (env ``MCP_LOG_FORMAT``; default json): one JSON object per line on stderr,
  or the text lines for people at a terminal (``mcpcore.logs``); ``MCP_LOG_LEVEL`` (INFO) sets the level.
- ``--otlp-endpoint URL`` (else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else
  ``OTEL_EXPORTER_OTLP_ENDPOINT``): where spans go over OTLP/gRPC; none: tracing is off
  (``mcpcore.tracing``). Set up before the service object is made, flushed after it stopped.
- ``MCP_BATCH_HELPER_THREADS`` (default on; ``0`` off): grpc's and libzmq's helper threads run under
  ``SCHED_BATCH`` (``mcpcore.helper_threads``: waking them does not preempt the event loop), looked for
  once started and every ``RESCAN_S`` after.

A service's process fields (``fields``: the worker's id) go on every log line, and into the trace
resource as ``mcp.<field>``. An exception that ends the process is logged (so it is a JSON line too) and
the exit status is 1.

Once started, everything the process made so far (modules, descriptors, the service's own objects) is
moved out of the garbage collector's passes (``gc.freeze``): it lives as long as the process, and a full
pass over it held the event loop ~9 ms on this machine, the largest single source of loop lag. The
collector's youngest generation is collected every ``GC_YOUNG_OBJECTS`` container allocations, not Python's
700: each pass walks what is alive of the young objects (the requests in flight), so at a few thousand
requests a second passes every few requests cost the router ~3% of its CPU (measured with gc.callbacks;
about 3.5% less mesh CPU per request at 20,000). The
GIL is handed over every 1 ms instead of Python's 5 (``SWITCH_INTERVAL_S``), so a worker's loop waits less
behind its executor threads. glibc's allocator keeps buffers up to ``HEAP_BUFFERS_UP_TO`` on its heap and
keeps up to ``HEAP_KEPT_BYTES`` of freed heap (``tune_allocator``): by default each large buffer was a
fresh mapping whose pages faulted in on first touch, ~10 ms for each 16 MiB tensor copy (1.6 ms warm),
several per bulk request in the router.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from mcpcore import helper_threads, logs, tracing
from mcpcore.config import add_flags, load_config, overrides_from_args
from mcpcore.errors import InvalidArgument, MCPError

__all__ = ["ProcessOptions", "Service", "main", "parse_args", "parse_config", "run", "setup_logging"]

C = TypeVar("C")
log = logging.getLogger(__name__)


class Service(Protocol):
    async def start(self) -> dict[str, str]: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class ProcessOptions:
    """The options every service process takes besides its config (the module's docstring)."""

    log_format: str = "json"
    otlp_endpoint: str = ""  # "" : tracing off
    batch_helper_threads: bool = True  # MCP_BATCH_HELPER_THREADS


def parse_args(
    prog: str, config_cls: type[C], env_prefix: str, argv: list[str] | None
) -> tuple[C, ProcessOptions]:
    """The service's config and the process's options from flags, env and YAML (``InvalidArgument``)."""
    parser = argparse.ArgumentParser(prog=prog, description=f"mcpmesh {prog}")
    parser.add_argument("--config", help=f"YAML file with {config_cls.__name__} fields")
    parser.add_argument(
        "--log-format", choices=logs.FORMATS, help="stderr lines: json (default) or text (env MCP_LOG_FORMAT)"
    )
    parser.add_argument(
        "--otlp-endpoint",
        help="send trace spans over OTLP/gRPC to this URL, e.g. http://127.0.0.1:4317 (env "
        "OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT; none: no tracing)",
    )
    add_flags(parser, config_cls, env_prefix=env_prefix)
    ns = parser.parse_args(argv)
    config = load_config(
        config_cls,
        yaml_path=ns.config,
        env=os.environ,
        env_prefix=env_prefix,
        overrides=overrides_from_args(ns),
        name=prog.removeprefix("mcp-"),
    )
    log_format = ns.log_format or os.environ.get("MCP_LOG_FORMAT", "").strip().lower() or "json"
    if log_format not in logs.FORMATS:
        raise InvalidArgument(f"MCP_LOG_FORMAT is {log_format!r}; use one of {', '.join(logs.FORMATS)}")
    batch = os.environ.get("MCP_BATCH_HELPER_THREADS", "1").strip().lower()
    if batch not in ("1", "0", "true", "false", "on", "off", ""):
        raise InvalidArgument(f"MCP_BATCH_HELPER_THREADS is {batch!r}; use 1 (the default) or 0")
    return config, ProcessOptions(
        log_format,
        tracing.endpoint(ns.otlp_endpoint or "", os.environ),
        batch_helper_threads=batch not in ("0", "false", "off"),
    )


def parse_config(prog: str, config_cls: type[C], env_prefix: str, argv: list[str] | None) -> C:
    return parse_args(prog, config_cls, env_prefix, argv)[0]


#: The GIL hand-over interval (Python's default is 5 ms): the event loop's thread waits at most this
#: long for the GIL while executor threads (a worker's batches, a service's blocking I/O) hold it.
SWITCH_INTERVAL_S = 0.001
GC_YOUNG_OBJECTS = 20_000


#: Allocations up to this size come from glibc's heap, not a fresh mapping (glibc's own cap is 32 MiB).
HEAP_BUFFERS_UP_TO = 32 << 20
#: Freed heap memory kept for reuse before glibc gives it back to the system.
HEAP_KEPT_BYTES = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_allocator() -> bool:
    """Keep large buffers on glibc's heap (the module's docstring); False where the C library is not
    glibc or refuses the setting."""
    import ctypes  # noqa: PLC0415  (once per process)

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, HEAP_BUFFERS_UP_TO)) and bool(
        mallopt(_M_TRIM_THRESHOLD, HEAP_KEPT_BYTES)
    )


def _batch_helpers() -> None:
    if changed := helper_threads.batch_helpers():
        log.debug("%d helper thread(s) now run under SCHED_BATCH", changed)


async def _keep_helpers_batched() -> None:
    """Put helper threads started since under SCHED_BATCH every ``RESCAN_S`` (libraries start some
    lazily, under load)."""
    while True:
        await asyncio.sleep(helper_threads.RESCAN_S)
        _batch_helpers()


async def serve(factory: Callable[[C], Service], config: C, *, batch_helper_threads: bool = True) -> None:
    tune_allocator()
    service = factory(config)  # inside the loop: services make grpc.aio and zmq.asyncio objects
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    endpoints = await service.start()
    gc.collect()
    gc.freeze()  # what start() made lives as long as the process: no full pass walks it again
    gc.set_threshold(GC_YOUNG_OBJECTS, *gc.get_threshold()[1:])
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # the loop thread waits less for the GIL
    helpers = None
    if batch_helper_threads:  # before "ready": whoever waits for it finds them batched
        _batch_helpers()
        helpers = asyncio.create_task(_keep_helpers_batched())
    print(json.dumps({"event": "ready", **endpoints}), flush=True)
    await stop.wait()
    if helpers is not None:
        helpers.cancel()
    try:
        await service.stop()
    except Exception:  # the process ends either way; a stop that failed halfway must be seen
        log.exception("stopping %s failed; exiting anyway", type(service).__name__)


def setup_logging(
    log_format: str = "json", *, service: str = "", fields: Mapping[str, str] | None = None
) -> None:
    """Log lines to stderr at ``MCP_LOG_LEVEL`` (INFO) in ``log_format``, as every service process does;
    ``service`` and ``fields`` go on every JSON line."""
    level = os.environ.get("MCP_LOG_LEVEL", "").strip() or "INFO"
    logs.setup(log_format, level=level, static={"service": service, **(fields or {})})


def run(
    prog: str,
    config: C,
    options: ProcessOptions,
    factory: Callable[[C], Service],
    *,
    fields: Mapping[str, str] | None = None,
) -> int:
    """Run the service until SIGTERM/SIGINT: logging and tracing set up first, spans flushed last."""
    try:
        setup_logging(options.log_format, service=prog, fields=fields)
    except ValueError as exc:  # MCP_LOG_LEVEL
        print(f"{prog}: MCP_LOG_LEVEL: {exc}", file=sys.stderr)
        return 2
    try:
        attributes = {f"mcp.{key}": value for key, value in (fields or {}).items()}
        tracing.setup(prog, options.otlp_endpoint, env=os.environ, attributes=attributes)
    except MCPError as exc:
        print(f"{prog}: {exc.message}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(factory, config, batch_helper_threads=options.batch_helper_threads))
    except Exception:
        log.critical("%s failed", prog, exc_info=True)
        return 1
    finally:
        tracing.shutdown()
    return 0


def main(
    prog: str,
    config_cls: type[C],
    env_prefix: str,
    factory: Callable[[C], Service],
    argv: list[str] | None = None,
    *,
    fields: Callable[[C], Mapping[str, str]] | None = None,
) -> int:
    """``fields(config)``: the process's own log fields and trace resource attributes (the worker's id)."""
    try:
        config, options = parse_args(prog, config_cls, env_prefix, argv)
    except MCPError as exc:
        print(f"{prog}: {exc.message}", file=sys.stderr)
        return 2
    return run(prog, config, options, factory, fields=fields(config) if fields else None)
