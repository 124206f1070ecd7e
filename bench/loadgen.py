"""Load generator in its own process: ``python bench/loadgen.py HOST:PORT MODEL CONC SECONDS [--rate R]``.

Closed loop (default): ``CONC`` coroutines each send a one-row FP32 [1, 64] ``mcpapi.v2.Inference/Infer``
(``--kserve``: KServe V2 ``ModelInfer``, input ``INPUT`` in ``raw_input_contents``; ``--direct``: the
SDK's direct path, ``AsyncMeshClient(HOST:PORT).infer(MODEL, {"INPUT": row}, direct=True)``) and wait for the
answer, for ``SECONDS`` after a short warm-up, over ``--connections`` TCP connections (1). Open loop
(``--rate R``): requests start at Poisson times, ``R`` a second, whatever the answers (at most ``CONC``
at once, so a stalled server cannot make the generator itself grow), the way traffic from many users
arrives at an overloaded server.
Prints one JSON line: rps (answered), p50/p99 latency (ms) of answered requests, errors, and for refusals
("exceeds maximum queue size") their count and p99 latency, plus client CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import time
from typing import Any

import grpc
import numpy as np

from mcpapi.kserve import grpc_service_pb2 as kserve_pb
from mcpapi.v2 import inference_pb2, inference_pb2_grpc
from mcpclient import AsyncMeshClient
from mcpcore.errors import MCPError

REFUSED = "exceeds maximum queue size"


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values) * 1e3, q)) if values else 0.0


def _call(channel: grpc.aio.Channel, model: str, kserve: bool) -> tuple[Any, Any]:
    """(the one request every client sends, the unary call that sends it)."""
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    if not kserve:
        tensor = inference_pb2.Tensor(name="INPUT0", dtype=11, shape=[1, 64], data=x.tobytes())
        return inference_pb2.InferRequest(model=model, inputs=[tensor]), inference_pb2_grpc.InferenceStub(
            channel
        ).Infer
    request = kserve_pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT", datatype="FP32", shape=x.shape)
    request.raw_input_contents.append(x.tobytes())
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=kserve_pb.ModelInferRequest.SerializeToString,
        response_deserializer=kserve_pb.ModelInferResponse.FromString,
    )
    return request, call


async def run(
    target: str,
    model: str,
    conc: int,
    seconds: float,
    *,
    rate: float = 0.0,
    kserve: bool = False,
    connections: int = 1,
    direct: bool = False,
) -> dict[str, float]:
    ok: list[float] = []
    refused: list[float] = []
    errors = 0
    measuring = False
    async with contextlib.AsyncExitStack() as stack:
        # each its own TCP connection (no shared subchannel), so that a server of several processes
        # behind one port (SO_REUSEPORT) gets them spread over its processes; clients take turns
        calls = [
            _call(
                await stack.enter_async_context(
                    grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                ),
                model,
                kserve,
            )
            for _ in range(connections)
        ]
        if direct:
            mesh = await stack.enter_async_context(AsyncMeshClient(target))
            row = {"INPUT": np.random.default_rng(0).random((1, 64), dtype=np.float32)}
            calls = [(row, lambda inputs, timeout: mesh.infer(model, inputs, timeout=timeout, direct=True))]
        turn = itertools.count()

        async def one() -> None:
            nonlocal errors
            request, infer = calls[next(turn) % len(calls)]
            start = time.perf_counter()
            try:
                await infer(request, timeout=10)
                if measuring:
                    ok.append(time.perf_counter() - start)
            except (grpc.aio.AioRpcError, MCPError) as err:
                if not measuring:
                    return
                code, details = (
                    (err.code, err.message) if isinstance(err, MCPError) else (err.code(), err.details())
                )
                if code == grpc.StatusCode.UNAVAILABLE and REFUSED in (details or ""):
                    refused.append(time.perf_counter() - start)
                else:
                    errors += 1

        stop_at = time.perf_counter() + 0.5 + seconds

        async def client() -> None:
            while time.perf_counter() < stop_at:
                await one()

        async def open_loop() -> None:
            slots = asyncio.Semaphore(conc)
            rng = random.Random(1)
            tasks = set()
            next_at = time.perf_counter()
            while next_at < stop_at:
                next_at += rng.expovariate(rate)
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                await slots.acquire()
                task = asyncio.create_task(one())
                task.add_done_callback(lambda _t: slots.release())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)

        work = (
            [asyncio.create_task(open_loop())]
            if rate
            else [asyncio.create_task(client()) for _ in range(conc)]
        )
        await asyncio.sleep(0.5)  # warm-up
        measuring, cpu0, started = True, time.process_time(), time.perf_counter()
        await asyncio.gather(*work)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu0
        fallbacks = mesh.stats.fallbacks if direct else 0
    return {
        "fallbacks": fallbacks,  # direct requests that went by the router instead (0 for a true figure)
        "rps": len(ok) / elapsed,
        "p50_ms": _pct(ok, 50),
        "p99_ms": _pct(ok, 99),
        "errors": errors,
        "refused": len(refused),
        "refused_p99_ms": _pct(refused, 99),
        "offered_rps": (len(ok) + len(refused) + errors) / elapsed,
        "client_cpu_s": cpu,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("model")
    parser.add_argument("conc", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("--rate", type=float, default=0.0, help="open loop: requests a second")
    parser.add_argument("--kserve", action="store_true", help="KServe V2 ModelInfer, input INPUT")
    parser.add_argument("--connections", type=int, default=1, help="TCP connections the clients share")
    parser.add_argument("--direct", action="store_true", help="the SDK's direct path (input INPUT)")
    args = parser.parse_args()
    figures = run(
        args.target, args.model, args.conc, args.seconds, rate=args.rate, kserve=args.kserve,
        connections=args.connections, direct=args.direct,
    )  # fmt: skip
    print(json.dumps(asyncio.run(figures)))
