"""mcp_health: not built yet (see the open issues)."""
