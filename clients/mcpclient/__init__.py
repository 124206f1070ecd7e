"""mcpclient: the Python SDK and the mcpctl operator CLI (not built yet)."""
