#!/usr/bin/env bash
# Installs etcd from Debian's etcd-server package when no etcd binary is on PATH.
set -euo pipefail
if command -v etcd >/dev/null 2>&1; then exit 0; fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
echo "etcd not found: installing Debian's etcd-server" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null
command -v etcd >/dev/null
