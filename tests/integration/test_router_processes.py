"""``--processes 2``: two router processes behind one gRPC and one REST port, sharing nothing but etcd.

Real processes throughout: a worker, a scheduler, and the router supervisor with its two routers. Each
client connection lands on one of them (SO_REUSEPORT); each process answers with its own id, counts
in its own metrics and stats keys, and one killed is started again while the other keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from harness import RouterProcess, make_demo_repository, metric, small_mesh, wait_for

from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.kserve import grpc_service_pb2_grpc as kserve_grpc
from mcpcore.etcd_store import EtcdStore
from mcpcore.keys import Keyspace

X = np.random.default_rng(5).random((1, 64), dtype=np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_demo_repository(tmp_path_factory.mktemp("repo") / "models")


def kserve_infer(address: str) -> bool:
    """One request on a connection of its own (a fresh channel, not shared): True if it was answered."""
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        stub = kserve_grpc.GRPCInferenceServiceStub(channel)
        request = kserve_pb.ModelInferRequest(
            model_name="demo-mlp",
            inputs=[
                kserve_pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[1, 64])
            ],
            raw_input_contents=[X.tobytes()],
        )
        try:
            reply = stub.ModelInfer(request, timeout=10)
            return reply.outputs[0].name == "OUTPUT0" and len(reply.raw_output_contents) == len(reply.outputs)
        except grpc.RpcError:
            return False


def served(metrics_address: str) -> float:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as resp:
        return metric(resp.read().decode(), "mcp_requests_total", model="demo-mlp", outcome="OK")


def routed_versions(metrics_address: str) -> set[str]:
    """The versions of demo-mlp in one router process's own table (its /debug/snapshot)."""
    with urllib.request.urlopen(f"http://{metrics_address}/debug/snapshot", timeout=5) as resp:
        model = json.loads(resp.read()).get("models", {}).get("demo-mlp", {})
    return {v for v, ring in model.get("versions", {}).items() if ring.get("nodes")}


def pid_of(router_id: str) -> int | None:
    """The live process started with ``--router-id router_id`` (None: none)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if router_id.encode() in args and b"mcp_router" in args:
                return int(entry.name)
    return None


def stats_keys(etcd_endpoint: str, keys: Keyspace) -> set[str]:
    async def read() -> set[str]:
        async with EtcdStore([etcd_endpoint]) as store:
            return {kv.key for kv in (await store.get_prefix(keys.stats_prefix())).items}

    return asyncio.run(read())


def test_two_router_processes_share_the_ports_and_nothing_else(tmp_path, etcd_endpoint, repo):
    with small_mesh(tmp_path, etcd_endpoint, repo, "demo-mlp", ["1"], router_flags={"processes": 2}) as mesh:
        router = mesh.router
        procs = router.endpoints["processes"]
        ids = [p["router_id"] for p in procs]
        assert ids == [f"{router.router_id}-0", f"{router.router_id}-1"]
        assert len({p["metrics"] for p in procs}) == 2  # each its own metrics port

        # small_mesh saw the model routed by whichever process answered; wait for each one's own table
        for p in procs:
            wait_for(lambda p=p: "1" in routed_versions(p["metrics"]), what=f"demo-mlp in {p['router_id']}")
        address = router.endpoints["grpc"]
        assert all(kserve_infer(address) for _ in range(24))  # 24 connections, spread by the kernel
        counts = [served(p["metrics"]) for p in procs]
        assert sum(counts) == 24 and all(counts), counts  # both served, each counted only its own

        keys = Keyspace(router.prefix)
        want = {keys.stats(i, "demo-mlp") for i in ids}  # each its own stats under its own lease
        wait_for(lambda: want <= stats_keys(etcd_endpoint, keys), what="both routers' stats in etcd")

        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                       "data": X.ravel().tolist()}]}).encode()  # fmt: skip
        rest = f"http://{router.endpoints['rest']}/v2/models/demo-mlp/infer"
        with urllib.request.urlopen(urllib.request.Request(rest, data=body), timeout=10) as resp:
            assert resp.status == 200 and json.loads(resp.read())["outputs"]

        first = pid_of(ids[0])
        assert first is not None
        os.kill(first, signal.SIGKILL)  # one router dies: the other serves, the supervisor starts it again
        wait_for(lambda: pid_of(ids[0]) not in (None, first), what="the killed router started again")
        wait_for(lambda: all(kserve_infer(address) for _ in range(8)), what="every connection answered")
        children = [pid_of(i) for i in ids]
    assert router.proc is not None and router.proc.returncode == 0  # SIGTERM: a clean stop of all
    assert all(pid is not None for pid in children)
    assert all(pid_of(i) is None for i in ids)  # none outlives the supervisor


def test_a_bad_process_count_is_refused_before_anything_starts():
    done = subprocess.run(
        [sys.executable, "-m", "mcp_router", "--processes", "0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "processes: must be within 1..64, got 0" in done.stderr


def test_a_second_router_on_a_taken_port_fails_instead_of_sharing_it(tmp_path, etcd_endpoint):
    """Only the routers of one --processes share a port: another one there would split its clients."""
    prefix = "/t-taken/mcp"
    first = RouterProcess(tmp_path, etcd_endpoint, prefix=prefix, scheduler="").start()
    try:
        port = first.endpoints["grpc"].rsplit(":", 1)[1]
        second = RouterProcess(tmp_path, etcd_endpoint, prefix=prefix, scheduler="", grpc_port=port)
        with pytest.raises(RuntimeError, match="exited"):
            second.start()
        assert second.proc is not None and second.proc.wait(10) != 0
        assert "Failed to bind" in second.log.read_text()
    finally:
        first.stop()


def test_routers_do_not_outlive_a_supervisor_killed_outright(tmp_path, etcd_endpoint):
    """kill -9 of the supervisor: its routers get SIGTERM from the kernel and stop (no orphan keeps the
    port and the router ids)."""
    router = RouterProcess(tmp_path, etcd_endpoint, prefix="/t-orphan/mcp", scheduler="", processes=2).start()
    ids = [p["router_id"] for p in router.endpoints["processes"]]
    assert all(pid_of(i) is not None for i in ids)
    router.kill()
    wait_for(lambda: all(pid_of(i) is None for i in ids), what="the routers gone with their supervisor")
