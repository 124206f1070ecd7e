"""Load generator in its own process: ``python bench/loadgen.py HOST:PORT MODEL CONC SECONDS [--rate R]``.

Closed loop (default): ``CONC`` coroutines each send a one-row FP32 [1, 64] ``mcpapi.v2.Inference/Infer``
and wait for the answer, for ``SECONDS`` after a short warm-up. Open loop (``--rate R``): requests start
at Poisson times, ``R`` a second, whatever the answers (at most ``CONC`` at once, so a stalled server
cannot make the generator itself grow), the way traffic from many users arrives at an overloaded server.
Prints one JSON line: rps (answered), p50/p99 latency (ms) of answered requests, errors, and for refusals
("exceeds maximum queue size") their count and p99 latency, plus client CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import grpc
import numpy as np

from mcpapi.v2 import inference_pb2, inference_pb2_grpc

REFUSED = "exceeds maximum queue size"


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values) * 1e3, q)) if values else 0.0


async def run(target: str, model: str, conc: int, seconds: float, rate: float = 0.0) -> dict[str, float]:
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    request = inference_pb2.InferRequest(
        model=model, inputs=[inference_pb2.Tensor(name="INPUT0", dtype=11, shape=[1, 64], data=x.tobytes())]
    )
    ok: list[float] = []
    refused: list[float] = []
    errors = 0
    measuring = False
    async with grpc.aio.insecure_channel(target) as channel:
        infer = inference_pb2_grpc.InferenceStub(channel).Infer

        async def one() -> None:
            nonlocal errors
            start = time.perf_counter()
            try:
                await infer(request, timeout=10)
                if measuring:
                    ok.append(time.perf_counter() - start)
            except grpc.aio.AioRpcError as err:
                if not measuring:
                    return
                if err.code() == grpc.StatusCode.UNAVAILABLE and REFUSED in (err.details() or ""):
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
    return {
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
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.target, args.model, args.conc, args.seconds, args.rate))))
