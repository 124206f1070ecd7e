"""mcp_scheduler: model control (v1, v2), placement, reconcile loop, safe version flips, leader election."""
