"""``python -m mcp_worker [--config worker.yaml] [--flags]``: run one worker until SIGTERM/SIGINT.

Configuration: defaults < ``--config`` YAML < ``MCP_WORKER_*`` env < flags. Once serving, one JSON line
``{"event": "ready", "worker_id": ..., "grpc": ..., "zmq": ..., "metrics": ...}`` goes to stdout, so a
launcher or a test waits for readiness by reading it, never by sleeping.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from mcp_worker.config import WorkerConfig
from mcp_worker.server import Worker
from mcpcore.config import add_flags, load_config, overrides_from_args
from mcpcore.errors import MCPError

ENV_PREFIX = "MCP_WORKER_"


def parse_config(argv: list[str] | None) -> WorkerConfig:
    parser = argparse.ArgumentParser(prog="mcp-worker", description="mcpmesh worker")
    parser.add_argument("--config", help="YAML file with WorkerConfig fields")
    add_flags(parser, WorkerConfig, env_prefix=ENV_PREFIX)
    ns = parser.parse_args(argv)
    return load_config(
        WorkerConfig,
        yaml_path=ns.config,
        env=os.environ,
        env_prefix=ENV_PREFIX,
        overrides=overrides_from_args(ns),
        name="worker",
    )


async def serve(config: WorkerConfig) -> None:
    worker = Worker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    endpoints = await worker.start()
    print(json.dumps({"event": "ready", **endpoints}), flush=True)
    await worker.run_until(stop)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=os.environ.get("MCP_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = parse_config(argv)
    except MCPError as exc:
        print(f"mcp-worker: {exc.message}", file=sys.stderr)
        return 2
    asyncio.run(serve(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
