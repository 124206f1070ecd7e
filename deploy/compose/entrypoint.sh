#!/bin/sh
# Starts one mcpmesh service: `entrypoint.sh worker|scheduler|router|health [flags...]`.
# Every setting is a flag or an MCP_<SERVICE>_<FIELD> variable (see each service's config.py); the
# services bind 127.0.0.1 by default, so in a container the *_HOST variables below open them up.
set -eu
service="${1:-router}"
[ $# -gt 0 ] && shift
case "$service" in
  worker|scheduler|router|health) ;;
  *) echo "entrypoint: unknown service '$service' (worker, scheduler, router or health)" >&2; exit 2 ;;
esac
upper=$(echo "$service" | tr a-z A-Z)
export "MCP_${upper}_GRPC_HOST=${MCP_BIND_HOST:-0.0.0.0}"
export "MCP_${upper}_METRICS_HOST=${MCP_BIND_HOST:-0.0.0.0}"
if [ "$service" = router ]; then export "MCP_ROUTER_REST_HOST=${MCP_BIND_HOST:-0.0.0.0}"; fi
exec python3 -m "mcp_${service}" "$@"
