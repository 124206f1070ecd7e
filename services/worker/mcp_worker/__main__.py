"""``python -m mcp_worker [--config worker.yaml] [--flags]``: run one worker until SIGTERM/SIGINT.

Configuration: defaults < ``--config`` YAML < ``MCP_WORKER_*`` env < flags; the process's options
(``--log-format``, ``--otlp-endpoint``, ``--tuning.*``) as every service (``mcpcore.runner``). Every log
line names the worker (``worker``). Once serving, one JSON line ``{"event": "ready", ...endpoints}`` goes
to stdout (see ``mcpcore.runner``).
"""

from __future__ import annotations

import sys

from mcp_worker.config import WorkerConfig
from mcp_worker.server import Worker
from mcpcore import runner


def main(argv: list[str] | None = None) -> int:
    return runner.main(
        "mcp-worker", WorkerConfig, "MCP_WORKER_", Worker, argv, fields=lambda c: {"worker": c.worker_id}
    )


if __name__ == "__main__":
    sys.exit(main())
