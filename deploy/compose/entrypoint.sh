#!/bin/sh
# Starts one mcpmesh service: `entrypoint.sh worker|scheduler|router|health [flags...]`, or `init`: wait for
# the workers and load the demo models (init_models.py), then exit.
# Every setting is a flag or an MCP_<SERVICE>_<FIELD> variable (see each service's config.py); the
# services bind 127.0.0.1 by default, so in a container the *_HOST variables below open them up
# (MCP_BIND_HOST, default 0.0.0.0; the compose test's host networking sets 127.0.0.1).
set -eu
service="${1:-router}"
[ $# -gt 0 ] && shift
case "$service" in
  worker|scheduler|router|health) ;;
  init) exec python3 /opt/mcpmesh/init_models.py "$@" ;;
  *) echo "entrypoint: unknown service '$service' (worker, scheduler, router, health or init)" >&2; exit 2 ;;
esac
upper=$(echo "$service" | tr a-z A-Z)
export "MCP_${upper}_GRPC_HOST=${MCP_BIND_HOST:-0.0.0.0}"
export "MCP_${upper}_METRICS_HOST=${MCP_BIND_HOST:-0.0.0.0}"
if [ "$service" = router ]; then export "MCP_ROUTER_REST_HOST=${MCP_BIND_HOST:-0.0.0.0}"; fi
exec python3 -m "mcp_${service}" "$@"
