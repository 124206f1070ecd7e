"""``python -m mcp_router [--config router.yaml] [--flags]``: run one router until SIGTERM/SIGINT.

Configuration: defaults < ``--config`` YAML < ``MCP_ROUTER_*`` env < flags. Once serving, one JSON line
``{"event": "ready", ...endpoints}`` goes to stdout (see ``mcpcore.runner``).
"""

from __future__ import annotations

import sys

from mcp_router.config import RouterConfig
from mcp_router.server import RouterServer
from mcpcore import runner


def main(argv: list[str] | None = None) -> int:
    return runner.main("mcp-router", RouterConfig, "MCP_ROUTER_", RouterServer, argv)


if __name__ == "__main__":
    sys.exit(main())
