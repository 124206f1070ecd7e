#!/usr/bin/env bash
# Installs the system tools the project runs, from Debian's packages, when they are missing:
#   etcd      (package etcd-server, plus etcdctl from etcd-client) — always
#   faketime  (package faketime) — with the argument "faketime": the clock-skew tests run workers under it
#   promtool  (package prometheus) — with the argument "promtool": checks the shipped alert rules
#   docker-compose (package docker-compose) — with the argument "docker-compose": validates deploy/compose
#   libb64    (package libb64-0d) — with the argument "libb64": Triton's perf_analyzer links it
#   iptables  (package iptables) — with the argument "iptables": make multihost cuts hosts off with it
#   grpc      (packages libgrpc++-dev, g++, pkg-config, python3-dev) — with the argument "grpc": make native
#             builds the router's grpc++ front door (libs/native/src/*.cc) with them
set -euo pipefail
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
install() {
    echo "installing Debian's $*" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
if [ "${1:-etcd}" = docker-compose ]; then
    command -v docker-compose >/dev/null 2>&1 || install docker-compose
    command -v docker-compose >/dev/null
    exit 0
fi
if [ "${1:-etcd}" = grpc ]; then
    python_h="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h"
    have() { pkg-config --exists grpc++ 2>/dev/null && command -v c++ >/dev/null 2>&1 && test -f "$python_h"; }
    have || install libgrpc++-dev g++ pkg-config python3-dev
    have
    exit 0
fi
if [ "${1:-etcd}" = iptables ]; then
    command -v iptables >/dev/null 2>&1 || install iptables
    command -v iptables >/dev/null
    exit 0
fi
if [ "${1:-etcd}" = libb64 ]; then
    ldconfig -p | grep -q 'libb64\.so\.0d' || install libb64-0d
    ldconfig -p | grep -q 'libb64\.so\.0d'
    exit 0
fi
if [ "${1:-etcd}" = promtool ]; then
    command -v promtool >/dev/null 2>&1 || install prometheus
    command -v promtool >/dev/null
    exit 0
fi
if [ "${1:-etcd}" = faketime ]; then
    command -v faketime >/dev/null 2>&1 || install faketime
    command -v faketime >/dev/null
    exit 0
fi
{ command -v etcd && command -v etcdctl; } >/dev/null 2>&1 || install etcd-server etcd-client
command -v etcd >/dev/null && command -v etcdctl >/dev/null
