"""Real router and worker processes put grpc's and libzmq's helper threads under SCHED_BATCH by the time
they say "ready" (``mcpcore.helper_threads``) when ``MCP_BATCH_HELPER_THREADS=1`` (the default,
``mcpcore.tuning``); their event loop's thread and every other keep the default; ``0`` leaves every thread
as it was."""

from __future__ import annotations

import os
import uuid

import pytest
from harness import RouterProcess, WorkerProcess, make_demo_repository

from mcpcore.helper_threads import HELPERS

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")


def threads(pid: int) -> dict[int, tuple[str, int]]:
    """tid -> (name, scheduling policy) of every thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                out[int(tid)] = (comm.read().strip(), os.sched_getscheduler(int(tid)))
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            continue
    return out


@pytest.mark.parametrize("setting", ["1", "0"], ids=["on", "off"])
def test_helper_threads_run_under_sched_batch_and_nothing_else_does(tmp_path, etcd_endpoint, setting):
    prefix = f"/t{uuid.uuid4().hex[:8]}/mcp"
    repo = make_demo_repository(tmp_path / "models")
    worker = WorkerProcess(tmp_path, etcd_endpoint, repo, prefix=prefix)
    router = RouterProcess(tmp_path, etcd_endpoint, prefix=prefix, scheduler="")
    # the helpers each must have by "ready": the router's grpc++ front door, the worker's tensor socket
    expected = ((worker, "ZMQbg/"), (router, "nexting_thread"))
    for proc, _ in expected:
        proc.env["MCP_BATCH_HELPER_THREADS"] = setting
        proc.start()
    try:
        for proc, must in expected:
            assert proc.proc is not None
            seen = threads(proc.proc.pid)
            assert any(name.startswith(must) for name, _ in seen.values()), (proc.name, seen)
            assert seen[proc.proc.pid][1] == os.SCHED_OTHER  # the event loop's thread
            for name, policy in seen.values():
                batched = name.startswith(HELPERS) and setting == "1"
                assert policy == (os.SCHED_BATCH if batched else os.SCHED_OTHER), (proc.name, name)
    finally:
        router.stop()
        worker.stop()
