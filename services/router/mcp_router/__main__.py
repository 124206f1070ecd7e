"""``python -m mcp_router [--config router.yaml] [--flags]``: run one router until SIGTERM/SIGINT.

Configuration: defaults < ``--config`` YAML < ``MCP_ROUTER_*`` env < flags; the process's options
(``--log-format``, ``--otlp-endpoint``, ``--tuning.*``) as every service (``mcpcore.runner``).
``--processes N`` (N > 1) runs N routers behind the same ports instead (``mcp_router.processes``): each
gets the same flags, so the same log format, tracing and tuning; the supervisor logs in that format too
and traces nothing. Once serving, one JSON line ``{"event": "ready", ...endpoints}`` goes to stdout (see
``mcpcore.runner``).
"""

from __future__ import annotations

import sys

from mcp_router.config import RouterConfig
from mcp_router.server import RouterServer
from mcpcore import runner
from mcpcore.errors import MCPError

PROG = "mcp-router"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        config, options = runner.parse_args(PROG, RouterConfig, "MCP_ROUTER_", args)
    except MCPError as exc:
        print(f"{PROG}: {exc.message}", file=sys.stderr)
        return 2
    if config.processes > 1:  # a supervisor of that many routers (mcp_router.processes)
        from mcp_router import processes  # noqa: PLC0415

        runner.setup_logging(options, service=PROG)
        return processes.supervise(config, args)
    return runner.run(PROG, config, RouterServer)


if __name__ == "__main__":
    sys.exit(main())
