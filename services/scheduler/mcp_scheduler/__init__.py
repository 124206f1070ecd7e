"""mcp_scheduler: not built yet (see the open issues)."""
