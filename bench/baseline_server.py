"""The one-hop baseline for ``make bench``: a plain grpc.aio server running the demo MLP in numpy.

``python bench/baseline_server.py REPO`` serves ``mcpapi.v2.Inference/Infer`` for demo-mlp/1 (same weights,
same contract as the router: OUTPUT0 and the RANK0 head), prints ``READY <port>``; what the router + worker
add is measured against it.
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
        self.w = safetensors.numpy.load_file(str(repo / "demo-mlp" / "1" / "weights.safetensors"))

    async def Infer(self, request, context):  # type: ignore[no-untyped-def]
        w = self.w
        t = request.inputs[0]
        x = np.frombuffer(t.data, np.float32).reshape(tuple(t.shape))
        hidden = np.maximum(x @ w["fc1.weight"] + w["fc1.bias"], 0)
        y = hidden @ w["fc2.weight"] + w["fc2.bias"]
        r = np.maximum(hidden @ w["rank1.weight"] + w["rank1.bias"], 0) @ w["rank2.weight"] + w["rank2.bias"]
        r = np.exp(r - r.max(axis=-1, keepdims=True))
        r /= r.sum(axis=-1, keepdims=True)
        outs = [
            inference_pb2.Tensor(name=name, dtype=11, shape=a.shape, data=a.astype(np.float32).tobytes())
            for name, a in (("OUTPUT0", y), ("RANK0", r))
        ]
        return inference_pb2.InferResponse(model=request.model, version="1", outputs=outs)


async def main(repo: Path) -> None:
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(Baseline(repo), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"READY {port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
