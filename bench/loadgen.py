"""Closed-loop load generator in its own process: ``python bench/loadgen.py HOST:PORT MODEL CONC SECONDS``.

``CONC`` coroutines each send a one-row FP32 [1, 64] ``mcpapi.v2.Inference/Infer`` and wait for the answer,
for ``SECONDS`` after a short warm-up; prints one JSON line: rps, p50/p99 latency (ms), errors, client CPU s.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import grpc
import numpy as np

from mcpapi.v2 import inference_pb2, inference_pb2_grpc


async def run(target: str, model: str, conc: int, seconds: float) -> dict[str, float]:
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    request = inference_pb2.InferRequest(
        model=model, inputs=[inference_pb2.Tensor(name="INPUT0", dtype=11, shape=[1, 64], data=x.tobytes())]
    )
    async with grpc.aio.insecure_channel(target) as channel:
        infer = inference_pb2_grpc.InferenceStub(channel).Infer
        latencies: list[float] = []
        errors = 0
        measuring = False
        stop_at = time.perf_counter() + 0.5 + seconds

        async def client() -> None:
            nonlocal errors
            while (now := time.perf_counter()) < stop_at:
                try:
                    await infer(request, timeout=10)
                    if measuring:
                        latencies.append(time.perf_counter() - now)
                except grpc.aio.AioRpcError:
                    errors += measuring

        tasks = [asyncio.create_task(client()) for _ in range(conc)]
        await asyncio.sleep(0.5)  # warm-up
        measuring, cpu0, started = True, time.process_time(), time.perf_counter()
        await asyncio.gather(*tasks)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu0
    lat = np.array(latencies) * 1e3 if latencies else np.array([0.0])
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "errors": errors,
        "client_cpu_s": cpu,
    }


if __name__ == "__main__":
    target, model, conc, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    print(json.dumps(asyncio.run(run(target, model, conc, seconds))))
