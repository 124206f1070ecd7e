"""``python -m mcp_scheduler [--config scheduler.yaml] [--flags]``: run one scheduler until SIGTERM/SIGINT.

Configuration: defaults < ``--config`` YAML < ``MCP_SCHEDULER_*`` env < flags; the process's options
(``--log-format``, ``--otlp-endpoint``, ``--tuning.*``) as every service (``mcpcore.runner``). Once
serving, one JSON line ``{"event": "ready", ...endpoints}`` goes to stdout (see ``mcpcore.runner``).
"""

from __future__ import annotations

import sys

from mcp_scheduler.config import SchedulerConfig
from mcp_scheduler.server import Scheduler
from mcpcore import runner


def main(argv: list[str] | None = None) -> int:
    return runner.main("mcp-scheduler", SchedulerConfig, "MCP_SCHEDULER_", Scheduler, argv)


if __name__ == "__main__":
    sys.exit(main())
