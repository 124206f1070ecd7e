"""Drive a KServe V2 gRPC server with Triton's own client (``tritonclient.grpc``); print a JSON report.

Usage: ``python triton_client_script.py [HOST:]PORT [--model demo-mlp] [--version V]
[--repo-model demo-onnx | --no-repository]``

Works against any server of the protocol: tests/integration/kserve_fake_server.py, the router
(127.0.0.1:8001) or Triton itself. The model must take INPUT0 FP32 [-1, 64] and give OUTPUT0; the input
batch is in the report ("input"), so a caller can compute the expected output. ``--repo-model`` is loaded,
then unloaded (pass ``--no-repository`` where that would disturb a cluster). Errors the server is
expected to give (unknown model, BYTES input, unknown output) are reported, not raised. Statistics are
taken before and after the inferences, so a caller can check what they added.

It runs as its own process because tritonclient's generated ``service_pb2`` and our
``mcpapi.kserve.grpc_service_pb2`` both define ``inference.*`` and cannot share one process.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

TIMEOUT_S = 10


def _error(call: Callable[[], Any]) -> dict[str, Any]:
    try:
        call()
    except InferenceServerException as exc:
        return {"status": exc.status(), "message": exc.message()}
    return {"status": "OK", "message": ""}


def _input(batch: np.ndarray) -> triton.InferInput:
    return _named_input("INPUT0", batch)


def _named_input(name: str, batch: np.ndarray) -> triton.InferInput:
    tensor = triton.InferInput(name, list(batch.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(batch))
    return tensor


def _health_and_metadata(client: triton.InferenceServerClient, model: str, version: str) -> dict[str, Any]:
    return {
        "live": client.is_server_live(client_timeout=TIMEOUT_S),
        "ready": client.is_server_ready(client_timeout=TIMEOUT_S),
        "model_ready": client.is_model_ready(model, version, client_timeout=TIMEOUT_S),
        "unknown_model_ready": client.is_model_ready("no-such-model", client_timeout=TIMEOUT_S),
        "server_metadata": client.get_server_metadata(as_json=True, client_timeout=TIMEOUT_S),
        "model_metadata": client.get_model_metadata(model, version, as_json=True, client_timeout=TIMEOUT_S),
        "unknown_model_metadata": _error(
            lambda: client.get_model_metadata("no-such-model", client_timeout=TIMEOUT_S)
        ),
        "model_config": client.get_model_config(model, version, as_json=True, client_timeout=TIMEOUT_S),
        "unknown_model_config": _error(
            lambda: client.get_model_config("no-such-model", client_timeout=TIMEOUT_S)
        ),
        "unknown_version_config": _error(
            lambda: client.get_model_config(model, "99", client_timeout=TIMEOUT_S)
        ),
    }


def _statistics(client: triton.InferenceServerClient, model: str, version: str) -> dict[str, Any]:
    return client.get_inference_statistics(model, version, as_json=True, client_timeout=TIMEOUT_S)


def _inference(client: triton.InferenceServerClient, model: str, version: str) -> dict[str, Any]:
    batch = np.random.default_rng(7).standard_normal((4, 64), dtype=np.float32)
    result = client.infer(
        model,
        [_input(batch)],
        model_version=version,
        outputs=[triton.InferRequestedOutput("OUTPUT0")],
        request_id="req-7",
        priority=2,
        timeout=5_000_000,  # microseconds, Triton's convention
        parameters={"routing_key": "user-42", "tenant": "blue"},
        client_timeout=TIMEOUT_S,
    )
    output = result.as_numpy("OUTPUT0")
    response = result.get_response(as_json=True)
    every = client.infer(model, [_input(batch[:1])], model_version=version)  # no deadline, all outputs
    bytes_input = triton.InferInput("INPUT0", [1], "BYTES")
    bytes_input.set_data_from_numpy(np.array([b"text"], dtype=np.object_))
    return {
        "input": batch.tolist(),
        "infer": {
            "id": response.get("id", ""),
            "model_name": response["model_name"],
            "model_version": response.get("model_version", ""),
            "outputs": [o["name"] for o in response["outputs"]],
            "dtype": str(output.dtype),
            "shape": list(output.shape),
            "values": output.tolist(),
        },
        "infer_all_outputs": {
            "outputs": [o["name"] for o in every.get_response(as_json=True)["outputs"]],
            "values": every.as_numpy("OUTPUT0").tolist(),
        },
        "errors": {
            "unknown_model": _error(
                lambda: client.infer("no-such-model", [_input(batch)], client_timeout=TIMEOUT_S)
            ),
            "bytes_input": _error(lambda: client.infer(model, [bytes_input], client_timeout=TIMEOUT_S)),
            "unknown_input": _error(
                lambda: client.infer(
                    model,
                    [_named_input("NO_SUCH_INPUT", batch)],
                    model_version=version,
                    client_timeout=TIMEOUT_S,
                )
            ),
            "wrong_shape": _error(
                lambda: client.infer(
                    model, [_input(batch[:, :63])], model_version=version, client_timeout=TIMEOUT_S
                )
            ),
            "unknown_output": _error(
                lambda: client.infer(
                    model,
                    [_input(batch)],
                    outputs=[triton.InferRequestedOutput("NO_SUCH_OUTPUT")],
                    client_timeout=TIMEOUT_S,
                )
            ),
        },
    }


def _streaming(client: triton.InferenceServerClient, model: str, version: str) -> dict[str, Any]:
    """ModelStreamInfer: three good requests and a bad one on one stream; each answer by its id."""
    import queue  # noqa: PLC0415  (only this part of the script needs it)

    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    batches = {f"s{i}": np.full((1 + i, 64), float(i), np.float32) for i in range(3)}
    try:
        for rid, batch in batches.items():
            client.async_stream_infer(model, [_input(batch)], model_version=version, request_id=rid)
        client.async_stream_infer(
            model,
            [_input(batches["s0"])],
            model_version=version,
            request_id="s-bad",
            outputs=[triton.InferRequestedOutput("NO_SUCH_OUTPUT")],
        )
        answers = [got.get(timeout=TIMEOUT_S) for _ in range(len(batches) + 1)]
    finally:
        client.stop_stream()
    seen: dict[str, Any] = {"inputs": {rid: b.tolist() for rid, b in batches.items()}, "ok": {}, "errors": []}
    for result, error in answers:
        if error is not None:
            seen["errors"].append(error.message())
        else:
            seen["ok"][result.get_response().id] = result.as_numpy("OUTPUT0").tolist()
    return seen


def _repository(client: triton.InferenceServerClient, repo_model: str) -> dict[str, Any]:
    def index() -> list[dict[str, Any]]:
        return client.get_model_repository_index(as_json=True, client_timeout=TIMEOUT_S).get("models", [])

    seen: dict[str, Any] = {"index": index()}
    client.load_model(repo_model, client_timeout=TIMEOUT_S)
    seen["after_load"] = {
        "ready": client.is_model_ready(repo_model, client_timeout=TIMEOUT_S),
        "index": index(),
    }
    client.unload_model(repo_model, client_timeout=TIMEOUT_S)
    seen["after_unload"] = {
        "ready": client.is_model_ready(repo_model, client_timeout=TIMEOUT_S),
        "index": index(),
    }
    seen["load_with_config"] = _error(
        lambda: client.load_model(repo_model, config="{}", client_timeout=TIMEOUT_S)
    )
    return seen


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", help="PORT (on 127.0.0.1) or HOST:PORT")
    parser.add_argument("--model", default="demo-mlp")
    parser.add_argument("--version", default="", help="empty lets the server pick")
    parser.add_argument("--repo-model", default="demo-onnx", help="the model to load, then unload")
    parser.add_argument("--no-repository", action="store_true", help="skip load and unload")
    args = parser.parse_args(argv)
    url = args.server if ":" in args.server else f"127.0.0.1:{args.server}"
    client = triton.InferenceServerClient(url)
    try:
        report = {"url": url} | _health_and_metadata(client, args.model, args.version)
        report["statistics_before"] = _statistics(client, args.model, args.version)
        report |= _inference(client, args.model, args.version)
        report["statistics_after"] = _statistics(client, args.model, args.version)
        report["statistics_all"] = _statistics(client, "", "")
        report["streaming"] = _streaming(client, args.model, args.version)
        report["statistics_unknown_version"] = _error(
            lambda: client.get_inference_statistics(args.model, "99", client_timeout=TIMEOUT_S)
        )
        if not args.no_repository:
            report["repository"] = _repository(client, args.repo_model)
    finally:
        client.close()
    json.dump(report, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
