"""The one-hop baseline for ``make bench``: a plain grpc.aio server running the peers' MLP in numpy.

``python bench/baseline_server.py`` serves KServe V2 ``inference.GRPCInferenceService/ModelInfer`` for
``bench-mlp`` (same weights as ``peer_model``, same request and response bytes as the router's front door:
``INPUT`` in ``raw_input_contents``, ``OUTPUT`` in ``raw_output_contents``), prints ``READY <port>``; what
the router + worker add is measured against it.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
from peer_model import weights

from mcpapi.kserve import grpc_service_pb2 as pb

W = weights()


async def model_infer(request: pb.ModelInferRequest, context: object) -> pb.ModelInferResponse:
    t = request.inputs[0]
    x = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(tuple(t.shape))
    hidden = np.maximum(x @ W["fc1.weight"] + W["fc1.bias"], 0)
    y = (hidden @ W["fc2.weight"] + W["fc2.bias"]).astype(np.float32)
    response = pb.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
    response.outputs.add(name="OUTPUT", datatype="FP32", shape=y.shape)
    response.raw_output_contents.append(y.tobytes())
    return response


async def main() -> None:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        model_infer,
        request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelInferResponse.SerializeToString,
    )
    service = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {"ModelInfer": handler})
    server.add_generic_rpc_handlers((service,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"READY {port}", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
