"""mcp_router: the data-plane entry: Route/Infer (v1, v2), KServe V2, consistent hashing, ZeroMQ."""
