"""mcp_health: failure detection and failover, emergency stops, breaker levels from error rates, alerts."""
