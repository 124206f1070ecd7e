"""mcp_router: not built yet (see the open issues)."""
