"""``python -m mcp_health [--config health.yaml] [--flags]``: run one health instance until SIGTERM/SIGINT.

Configuration: defaults < ``--config`` YAML < ``MCP_HEALTH_*`` env < flags; the process's options
(``--log-format``, ``--otlp-endpoint``, ``--tuning.*``) as every service (``mcpcore.runner``). Once
serving, one JSON line ``{"event": "ready", ...endpoints}`` goes to stdout (see ``mcpcore.runner``).
"""

from __future__ import annotations

import sys

from mcp_health.config import HealthConfig
from mcp_health.server import HealthServer
from mcpcore import runner


def main(argv: list[str] | None = None) -> int:
    return runner.main("mcp-health", HealthConfig, "MCP_HEALTH_", HealthServer, argv)


if __name__ == "__main__":
    sys.exit(main())
