"""mcp_worker: runs models: repository, backends, dynamic batching, ZeroMQ tensor server, control API."""
