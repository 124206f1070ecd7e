"""The worker's receive of a large tensor frame, two ways, for ``make bench`` (DESIGN.md section 9):
``recv(copy=False)`` (libzmq's own message buffer, wrapped as a frame, read with ``np.frombuffer``) against
``recv_into`` a native-pool block (what the tensor server does for frames of at least 1 MiB: one copy
into memory faulted in once, pinned when CUDA is present).

A sender in another process keeps the socket fed (the load); the receiver alternates the two ways one
message at a time for the whole budget, so drift in machine load hits both, and each message is read once
(a sum over it, as a backend would) before its buffer goes. Each is timed from a message already waiting
(after a poll), so the sender's pace is not in it. The figures are medians per message of receive +
read, at 1 and 16 MiB.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import numpy as np
import zmq
from mempool_bench import ensure_library

from mcp_native.pool import Pool

SIZES = {"1mib": 1 << 20, "16mib": 16 << 20}
SENDER = """
import sys, zmq
size = int(sys.argv[2]); sock = zmq.Context.instance().socket(zmq.PUSH); sock.sndhwm = 4
sock.connect(sys.argv[1]); payload = bytes(size)
while True:
    sock.send(payload, copy=False)
"""


def _one(sock: zmq.Socket, block: object | None, size: int) -> float:
    if not sock.poll(10_000, zmq.POLLIN):  # timed from a message already waiting: not the sender's pace
        raise RuntimeError("the sender stopped sending")
    start = time.perf_counter()
    if block is None:
        frame = sock.recv(copy=False)
        data = np.frombuffer(frame.buffer, np.uint8)
    else:
        data = block.array(np.uint8)[:size]  # type: ignore[attr-defined]
        sock.recv_into(data)
    int(data[::4096].sum())  # read it (one byte a page), as a backend would touch its input
    return time.perf_counter() - start


def bench_receive(repo: object, seconds: float) -> dict[str, float]:
    del repo
    ensure_library()
    figures: dict[str, float] = {}
    for label, size in SIZES.items():
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.PULL)
        sock.rcvhwm = 4
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        sender = subprocess.Popen([sys.executable, "-c", SENDER, f"tcp://127.0.0.1:{port}", str(size)])
        pool = Pool(size, 1)
        block = pool.alloc()
        try:
            for _ in range(4):  # warm-up: connection, first faults
                _one(sock, None, size)
                _one(sock, block, size)
            copy_free: list[float] = []
            into_pool: list[float] = []
            deadline = time.perf_counter() + seconds / len(SIZES)
            while time.perf_counter() < deadline:
                copy_free.append(_one(sock, None, size))
                into_pool.append(_one(sock, block, size))
        finally:
            sender.kill()
            sender.wait(10)
            pool.free(block)
            sock.close(linger=0)
        a, b = statistics.median(copy_free) * 1e3, statistics.median(into_pool) * 1e3
        figures[f"receive_copy_false_ms_{label}"] = round(a, 3)
        figures[f"receive_into_pool_ms_{label}"] = round(b, 3)
        print(
            f"worker receive of a {label} frame + one read: recv(copy=False) {a:.3f} ms | recv_into a pool "
            f"block {b:.3f} ms ({len(copy_free)} each, alternating)"
        )
    return figures
