"""``python -m mcp_scheduler [--config scheduler.yaml] [--flags]``: run one scheduler until SIGTERM/SIGINT.

Configuration: defaults < ``--config`` YAML < ``MCP_SCHEDULER_*`` env < flags. Once serving it prints one
JSON line ``{"event": "ready", "scheduler_id", "grpc", "metrics"}`` to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys

from mcp_scheduler.config import SchedulerConfig
from mcp_scheduler.server import Scheduler
from mcpcore.config import add_flags, load_config, overrides_from_args
from mcpcore.errors import MCPError

ENV_PREFIX = "MCP_SCHEDULER_"


def parse_config(argv: list[str] | None) -> SchedulerConfig:
    parser = argparse.ArgumentParser(prog="mcp-scheduler", description="mcpmesh scheduler")
    parser.add_argument("--config", help="YAML file with SchedulerConfig fields")
    add_flags(parser, SchedulerConfig, env_prefix=ENV_PREFIX)
    ns = parser.parse_args(argv)
    return load_config(
        SchedulerConfig,
        yaml_path=ns.config,
        env=os.environ,
        env_prefix=ENV_PREFIX,
        overrides=overrides_from_args(ns),
        name="scheduler",
    )


async def serve(config: SchedulerConfig) -> None:
    scheduler = Scheduler(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    endpoints = await scheduler.start()
    print(json.dumps({"event": "ready", **endpoints}), flush=True)
    await stop.wait()
    with contextlib.suppress(Exception):
        await scheduler.stop()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get("MCP_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = parse_config(argv)
    except MCPError as exc:
        print(f"mcp-scheduler: {exc.message}", file=sys.stderr)
        return 2
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
