"""mcp_native: the ctypes binding to libs/native (not built yet)."""
