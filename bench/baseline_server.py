"""The one-hop baseline for ``make bench``: a plain grpc.aio server running the demo MLP in numpy.

``python bench/baseline_server.py REPO`` serves ``mcpapi.v2.Inference/Infer`` for demo-mlp/1 (same weights,
same contract as the router), prints ``READY <port>``; what the router + worker add is measured against it.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc
import numpy as np
import safetensors.numpy

from mcpapi.v2 import inference_pb2, inference_pb2_grpc


class Baseline(inference_pb2_grpc.InferenceServicer):
    def __init__(self, repo: Path) -> None:
        w = safetensors.numpy.load_file(str(repo / "demo-mlp" / "1" / "weights.safetensors"))
        self.w1, self.b1, self.w2, self.b2 = w["fc1.weight"], w["fc1.bias"], w["fc2.weight"], w["fc2.bias"]

    async def Infer(self, request, context):  # type: ignore[no-untyped-def]
        t = request.inputs[0]
        x = np.frombuffer(t.data, np.float32).reshape(tuple(t.shape))
        y = np.maximum(x @ self.w1 + self.b1, 0) @ self.w2 + self.b2
        out = inference_pb2.Tensor(
            name="OUTPUT0", dtype=11, shape=y.shape, data=y.astype(np.float32).tobytes()
        )
        return inference_pb2.InferResponse(model=request.model, version="1", outputs=[out])


async def main(repo: Path) -> None:
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(Baseline(repo), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"READY {port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
