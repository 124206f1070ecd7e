"""One way to run a service process: config from flags > env > YAML, logging, signals, a "ready" line.

Each service's ``__main__`` is a call to ``main(...)`` with its config class and a factory; the service
object needs ``async start() -> dict`` (its endpoints, printed as one JSON line ``{"event": "ready", ...}``
on stdout, which launchers and tests wait for instead of sleeping) and ``async stop()``.

Once started, everything the process made so far (modules, descriptors, the service's own objects) is
moved out of the garbage collector's passes (``gc.freeze``): it lives as long as the process, and a full
pass over it held the event loop ~9 ms on this machine, the largest single source of loop lag. The
GIL is handed over every 1 ms instead of Python's 5 (``SWITCH_INTERVAL_S``), so a worker's loop waits less
behind its executor threads.
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
from collections.abc import Callable
from typing import Protocol, TypeVar

from mcpcore.config import add_flags, load_config, overrides_from_args
from mcpcore.errors import MCPError

__all__ = ["Service", "main", "parse_config", "setup_logging"]

C = TypeVar("C")


class Service(Protocol):
    async def start(self) -> dict[str, str]: ...

    async def stop(self) -> None: ...


def parse_config(prog: str, config_cls: type[C], env_prefix: str, argv: list[str] | None) -> C:
    parser = argparse.ArgumentParser(prog=prog, description=f"mcpmesh {prog}")
    parser.add_argument("--config", help=f"YAML file with {config_cls.__name__} fields")
    add_flags(parser, config_cls, env_prefix=env_prefix)
    ns = parser.parse_args(argv)
    return load_config(
        config_cls,
        yaml_path=ns.config,
        env=os.environ,
        env_prefix=env_prefix,
        overrides=overrides_from_args(ns),
        name=prog.removeprefix("mcp-"),
    )


#: The GIL hand-over interval (Python's default is 5 ms): the event loop's thread waits at most this
#: long for the GIL while executor threads (a worker's batches, a service's blocking I/O) hold it.
SWITCH_INTERVAL_S = 0.001


async def serve(factory: Callable[[C], Service], config: C) -> None:
    service = factory(config)  # inside the loop: services make grpc.aio and zmq.asyncio objects
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    endpoints = await service.start()
    gc.collect()
    gc.freeze()  # what start() made lives as long as the process: no full pass walks it again
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # the loop thread waits less for the GIL
    print(json.dumps({"event": "ready", **endpoints}), flush=True)
    await stop.wait()
    try:
        await service.stop()
    except Exception:  # the process ends either way; a stop that failed halfway must be seen
        logging.getLogger(__name__).exception("stopping %s failed; exiting anyway", type(service).__name__)


def setup_logging() -> None:
    """Log lines to stderr at ``MCP_LOG_LEVEL`` (INFO), as every service process does."""
    logging.basicConfig(
        level=os.environ.get("MCP_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(
    prog: str,
    config_cls: type[C],
    env_prefix: str,
    factory: Callable[[C], Service],
    argv: list[str] | None = None,
) -> int:
    setup_logging()
    try:
        config = parse_config(prog, config_cls, env_prefix, argv)
    except MCPError as exc:
        print(f"{prog}: {exc.message}", file=sys.stderr)
        return 2
    asyncio.run(serve(factory, config))
    return 0
