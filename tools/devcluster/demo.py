"""The demo the development cluster runs: the models it loads, their repository, and a client's requests.

``DEMO`` is also what compose's ``init`` service loads (deploy/compose/init_models.py), so the two
deployments serve the same models. The repository is built by ``tools/make_models.py``.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import grpc
import numpy as np

from mcpapi.v2 import inference_pb2, inference_pb2_grpc, model_pb2
from mcpcore import dtypes
from mcpcore.tls import TLSConfig, channel

__all__ = ["DEMO", "build_repository", "run_client"]

DEMO = [
    model_pb2.ModelSpec(model="demo-mlp", versions=["1", "2"], replicas=2, fallback_version="1"),
    model_pb2.ModelSpec(model="demo-onnx", versions=["1"], replicas=1),
    model_pb2.ModelSpec(model="demo-mlp-enc", versions=["1"], replicas=1),
    model_pb2.ModelSpec(model="demo-stateful", versions=["1"], replicas=2),
    model_pb2.ModelSpec(model="demo-strlen", versions=["1"], replicas=1),  # BYTES (KServe clients)
    model_pb2.ModelSpec(model="demo-stream", versions=["1"], replicas=1),  # decoupled (ModelStreamInfer)
]
_MAKE_MODELS = Path(__file__).resolve().parents[1] / "make_models.py"


def build_repository(root: Path) -> Path:
    """The demo model repository in ``root``, built afresh; returns its absolute path."""
    spec = importlib.util.spec_from_file_location("make_models", _MAKE_MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make_models(root, force=True)
    return root.resolve()


def run_client(router: str, tls: TLSConfig | None = None) -> None:
    """A few requests through the router (as ``tls``'s identity where given), one line printed per model."""
    stub = inference_pb2_grpc.InferenceStub(channel(router, tls))
    x = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    tensor = inference_pb2.Tensor(
        name="INPUT0", dtype=dtypes.wire_value("FP32"), shape=[1, 64], data=x.tobytes()
    )
    for model, key in (
        ("demo-mlp", "user-1"),
        ("demo-mlp", "user-2"),
        ("demo-onnx", ""),
        ("demo-mlp-enc", ""),
        ("demo-stateful", ""),
    ):
        for _ in range(50):  # the router learns of the new routes from etcd within milliseconds
            try:
                reply = stub.Infer(
                    inference_pb2.InferRequest(model=model, routing_key=key, inputs=[tensor]), timeout=10
                )
                break
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    raise
                time.sleep(0.1)
        first = reply.outputs[0]
        head = ", ".join(f"{v:.4f}" for v in np.frombuffer(first.data, np.float32)[:3])
        names = ", ".join(o.name for o in reply.outputs)
        where = f"{model}/{reply.version} on {reply.worker_id}"
        print(f"demo client: {where}: outputs {names}; {first.name}[:3] = [{head}]")
