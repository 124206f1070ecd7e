"""A real grpc.aio KServe V2 server for tests: ``KServeServicer`` over an in-process numpy DataPlane.

Run as ``python kserve_fake_server.py [PORT]`` (default 0: any free port on 127.0.0.1). Prints
``READY <port>`` once serving, then one ``CALL <json>`` line per ModelInfer with what the DataPlane was
given, so a test can check the parameter mapping. Runs until killed.

Models: ``demo-mlp`` version 1 (READY), the demo MLP's shape (64 -> 256 -> ReLU -> 16) with weights from a
fixed seed (``mlp_weights``); ``demo-onnx`` version 1 (UNAVAILABLE until loaded; it cannot infer).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping

import grpc
import numpy as np

from mcp_router.dataplane import (
    DataPlane,
    InferResult,
    ModelConfigInfo,
    ModelIndexEntry,
    ModelMetadata,
    ModelStats,
    RouteDecision,
    TensorMeta,
)
from mcp_router.frontends.kserve_grpc import KServeServicer
from mcpapi.kserve import grpc_service_pb2_grpc
from mcpcore.errors import InvalidArgument, NotFound
from mcpcore.transport.guarded import GuardedServer

SEED = 20240611
INPUT = TensorMeta("INPUT0", "FP32", (-1, 64))
OUTPUT = TensorMeta("OUTPUT0", "FP32", (-1, 16))


def mlp_weights(seed: int = SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((64, 256)) / 8).astype(np.float32),
        "b1": (rng.standard_normal(256) / 8).astype(np.float32),
        "w2": (rng.standard_normal((256, 16)) / 16).astype(np.float32),
        "b2": (rng.standard_normal(16) / 16).astype(np.float32),
    }


def mlp(x: np.ndarray, w: Mapping[str, np.ndarray]) -> np.ndarray:
    hidden = np.maximum(x @ w["w1"] + w["b1"], 0)
    return hidden @ w["w2"] + w["b2"]


class NumpyDataPlane(DataPlane):
    def __init__(self) -> None:
        self.weights = mlp_weights()
        self.state = {"demo-mlp": "READY", "demo-onnx": "UNAVAILABLE"}

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def model_ready(self, model: str, version: str = "") -> bool:
        return self.state.get(model) == "READY" and version in ("", "1")

    def model_metadata(self, model: str, version: str = "") -> ModelMetadata:
        if not self.model_ready(model, version):
            raise NotFound(f"model {model} version {version or '(any)'} has no serving version")
        return ModelMetadata(model, ("1",), "numpy", (INPUT,), (OUTPUT,))

    def model_config(self, model: str, version: str = "") -> ModelConfigInfo:
        meta = self.model_metadata(model, version)
        return ModelConfigInfo(
            model, "1", "numpy", 8, meta.inputs, meta.outputs, None, 1, "cpu", meta.versions
        )

    async def model_statistics(self, model: str = "", version: str = "") -> list[ModelStats]:
        names = [model] if model else [m for m in self.state if self.model_ready(m)]
        for name in names:
            self.model_metadata(name, version)
        return [ModelStats(name, "1") for name in names]

    def route(
        self, model: str, version: str = "", routing_key: str = "", candidates: int = 1
    ) -> RouteDecision:
        self.model_metadata(model, version)
        return RouteDecision(model, "1", "local", "inproc://local", 0, 0)

    async def infer(
        self,
        model: str,
        version: str,
        request_id: str,
        inputs: Mapping[str, np.ndarray],
        **options,  # type: ignore[no-untyped-def]
    ) -> InferResult:
        self.model_metadata(model, version)
        if model != "demo-mlp":
            raise NotFound(f"model {model} has no runnable backend in this fake")
        x = inputs.get("INPUT0")
        if x is None or x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != 64:
            got = {name: (str(a.dtype), list(a.shape)) for name, a in inputs.items()}
            raise InvalidArgument(f"model {model} takes INPUT0 FP32 [-1, 64]; got {got}")
        call = {"model": model, "version": version, "request_id": request_id, "shape": list(x.shape)}
        shown = options | {"parameters": dict(options.get("parameters") or {})}  # any Mapping (the contract)
        print("CALL", json.dumps(call | shown), flush=True)
        unknown = [name for name in options.get("outputs", ()) if name != "OUTPUT0"]
        if unknown:  # the DataPlane's part of the contract, as the router's
            raise InvalidArgument(f"model {model} has no output(s) {unknown}; it has ['OUTPUT0']")
        return InferResult(model, "1", "local", {"OUTPUT0": mlp(x, self.weights)})

    def index(self) -> list[ModelIndexEntry]:
        return [ModelIndexEntry(name, "1", state) for name, state in sorted(self.state.items())]

    async def load(self, model: str, version: str = "") -> None:
        if model not in self.state:
            raise NotFound(f"model {model} is not in the repository")
        self.state[model] = "READY"

    async def unload(self, model: str) -> None:
        if model not in self.state:
            raise NotFound(f"model {model} is not in the repository")
        self.state[model] = "UNAVAILABLE"


async def serve(port: int) -> None:
    server = grpc.aio.server()
    grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        KServeServicer(NumpyDataPlane(), version="0.1.0-test"), GuardedServer(server)
    )
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("READY", bound, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
