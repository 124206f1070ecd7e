"""Running a service process: config from flags > env > YAML, logging, tracing, tuning, signals, "ready".

Each service's ``__main__`` is a call to ``main(...)`` with its config class and a factory; the service
object needs ``async start() -> dict`` (its endpoints, printed as one JSON line ``{"event": "ready", ...}``
on stdout, which launchers and tests wait for instead of sleeping) and ``async stop()``.

A service's config nests the process's own options as ``process`` (``mcpcore.settings.ProcessOptions``:
``--log-format``, ``--log-level``, ``--otlp-endpoint``, ``--trace-sample-ratio``, the ``tuning`` section),
read like every other setting; ``parse_args`` is where the process's environment is handed to the loader.

- Logging: lines on stderr in the format and from the level chosen (``mcpcore.logs``).
- Tracing (``mcpcore.tracing``): set up before the service object is made when an OTLP endpoint is set,
  flushed after the service stopped.
- Tuning (``mcpcore.tuning``): glibc's heap thresholds before the service object is made; once it started,
  the collector and GIL knobs; grpc's and libzmq's helper threads under ``SCHED_BATCH``
  (``mcpcore.helper_threads``) before "ready", and again every ``RESCAN_S`` for those started later.

A service's process fields (``fields``: the worker's id) go on every log line, and into the trace
resource as ``mcp.<field>``. An exception that ends the process is logged (so it is a JSON line too) and
the exit status is 1; a bad setting is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from mcpcore import helper_threads, logs, tracing, tuning
from mcpcore.config import add_flags, environment, load_config, overrides_from_args
from mcpcore.errors import MCPError
from mcpcore.settings import ProcessOptions

__all__ = ["Service", "ServiceConfig", "main", "parse_args", "run", "setup_logging"]

log = logging.getLogger(__name__)


class Service(Protocol):
    async def start(self) -> dict[str, str]: ...

    async def stop(self) -> None: ...


class ServiceConfig(Protocol):
    """What the runner needs of a service's config: the process's options, nested."""

    @property
    def process(self) -> ProcessOptions: ...


C = TypeVar("C", bound=ServiceConfig)


def parse_args(
    prog: str, config_cls: type[C], env_prefix: str, argv: list[str] | None
) -> tuple[C, ProcessOptions]:
    """The service's config and the process's options (``config.process``) from flags, the environment
    and YAML (``InvalidArgument``)."""
    parser = argparse.ArgumentParser(prog=prog, description=f"mcpmesh {prog}")
    parser.add_argument("--config", help=f"YAML file with {config_cls.__name__} fields")
    add_flags(parser, config_cls, env_prefix=env_prefix)
    ns = parser.parse_args(argv)
    config = load_config(
        config_cls,
        yaml_path=ns.config,
        env=environment(),
        env_prefix=env_prefix,
        overrides=overrides_from_args(ns),
        name=prog.removeprefix("mcp-"),
    )
    return config, config.process


def _batch_helpers() -> None:
    if changed := helper_threads.batch_helpers():
        log.debug("%d helper thread(s) now run under SCHED_BATCH", changed)


async def _keep_helpers_batched() -> None:
    """Put helper threads started since under SCHED_BATCH every ``RESCAN_S`` (libraries start some
    lazily, under load)."""
    while True:
        await asyncio.sleep(helper_threads.RESCAN_S)
        _batch_helpers()


async def serve(factory: Callable[[C], Service], config: C) -> None:
    knobs = config.process.tuning
    if not tuning.tune_allocator(knobs):
        log.info("tuning: glibc's heap thresholds not set (not glibc, or refused)")
    service = factory(config)  # inside the loop: services make grpc.aio and zmq.asyncio objects
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    endpoints = await service.start()
    tuning.after_start(knobs)  # what start() made lives as long as the process: frozen
    helpers = None
    if knobs.batch_helper_threads:  # before "ready": whoever waits for it finds them batched
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
    options: ProcessOptions, *, service: str = "", fields: Mapping[str, str] | None = None
) -> None:
    """Log lines to stderr in the process's format from its level, as every service process does;
    ``service`` and ``fields`` go on every JSON line."""
    logs.setup(options.log_format, level=options.log_level, static={"service": service, **(fields or {})})


def run(
    prog: str, config: C, factory: Callable[[C], Service], *, fields: Mapping[str, str] | None = None
) -> int:
    """Run the service until SIGTERM/SIGINT: logging and tracing set up first, spans flushed last."""
    options = config.process
    setup_logging(options, service=prog, fields=fields)
    attributes = {f"mcp.{key}": value for key, value in (fields or {}).items()}
    tracing.setup(prog, options.otlp_endpoint, sample_ratio=options.trace_sample_ratio, attributes=attributes)
    try:
        asyncio.run(serve(factory, config))
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
        config, _ = parse_args(prog, config_cls, env_prefix, argv)
    except MCPError as exc:
        print(f"{prog}: {exc.message}", file=sys.stderr)
        return 2
    return run(prog, config, factory, fields=fields(config) if fields else None)
