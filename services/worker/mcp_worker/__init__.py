"""mcp_worker: not built yet (see the open issues)."""
