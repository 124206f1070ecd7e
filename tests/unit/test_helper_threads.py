"""``mcpcore.helper_threads`` on this process's own threads, with the real kernel (Linux): a thread named as
a library helper goes under SCHED_BATCH, every other keeps its policy; ``MCP_BATCH_HELPER_THREADS``."""

import ctypes
import os
import threading

import pytest

from mcp_worker.config import WorkerConfig
from mcpcore import helper_threads, runner
from mcpcore.tuning import Tuning

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
PR_SET_NAME = 15


def named_thread(name: str) -> tuple[threading.Thread, int, threading.Event]:
    """A thread that names itself ``name`` (as libzmq and grpc name theirs) and waits; its tid."""
    ready, done, tid = threading.Event(), threading.Event(), []

    def body() -> None:
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode(), 0, 0, 0)
        tid.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert ready.wait(5)
    return thread, tid[0], done


def test_helpers_go_under_sched_batch_others_keep_their_policy():
    helper, helper_tid, stop_helper = named_thread("ZMQbg/IO/7")
    other, other_tid, stop_other = named_thread("mcp-exec_9")
    try:
        assert helper_threads.batch_helpers() >= 1
        assert os.sched_getscheduler(helper_tid) == os.SCHED_BATCH
        assert os.sched_getscheduler(other_tid) == os.SCHED_OTHER
        assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER
        assert helper_threads.batch_helpers() == 0  # done once: nothing changes the second time
    finally:
        stop_helper.set()
        stop_other.set()
        helper.join()
        other.join()


def test_no_proc_tree_changes_nothing(tmp_path):
    assert helper_threads.batch_helpers(tmp_path / "absent") == 0


def test_the_setting_comes_from_the_environment(monkeypatch):
    """``MCP_BATCH_HELPER_THREADS`` (the tuning section's ``batch_helper_threads``; its default follows the
    cores: tests/unit/test_tuning.py)."""
    args = ["--worker-id", "w-x"]

    def batched() -> bool:
        return runner.parse_args("mcp-worker", WorkerConfig, "MCP_WORKER_", args)[
            1
        ].tuning.batch_helper_threads

    monkeypatch.delenv("MCP_BATCH_HELPER_THREADS", raising=False)
    assert batched() == Tuning.for_this_process().batch_helper_threads
    monkeypatch.setenv("MCP_BATCH_HELPER_THREADS", "0")
    assert not batched()
    monkeypatch.setenv("MCP_BATCH_HELPER_THREADS", "1")
    assert batched()
    monkeypatch.setenv("MCP_BATCH_HELPER_THREADS", "maybe")
    assert runner.main("mcp-worker", WorkerConfig, "MCP_WORKER_", lambda c: None, args) == 2  # type: ignore[arg-type,return-value]
