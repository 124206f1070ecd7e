"""Triton's own ``tritonclient.grpc`` against a router: BYTES, BF16, decoupled streaming, request
parameters and sequences; prints one JSON report (numbers as lists, bytes as latin-1 strings).

Usage: ``python triton_types_script.py HOST:PORT types`` (every case on demo-strlen, demo-stream and
mlp-bf16) or ``... seq ID [--start] [--end] [--stream]`` (one demo-mlp request of sequence ID, unary or on
a stream).

It runs as its own process because tritonclient's generated ``service_pb2`` and our
``mcpapi.kserve.grpc_service_pb2`` both define ``inference.*`` and cannot share one process.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
from typing import Any

import ml_dtypes
import numpy as np
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

TIMEOUT_S = 30
TEXT = [b"hello", "h\u00e9llo".encode(), b"", b"\xff\x00bin"]


def _b(values: Any) -> list[str]:
    return [bytes(v).decode("latin-1") for v in np.asarray(values).reshape(-1)]


def _error(exc: InferenceServerException) -> dict[str, str]:
    return {"status": exc.status() or "", "message": exc.message() or ""}


def _n(n: int) -> triton.InferInput:
    x = triton.InferInput("N", [1], "INT32")
    x.set_data_from_numpy(np.array([n], dtype=np.int32))
    return x


def _stream(url: str, requests: list[dict[str, Any]], expect: int) -> list[dict[str, Any]]:
    """The first ``expect`` callbacks of one stream carrying ``requests``."""
    client = triton.InferenceServerClient(url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    out = []
    try:
        for kwargs in requests:
            client.async_stream_infer(**kwargs)
        for _ in range(expect):
            result, error = got.get(timeout=TIMEOUT_S)
            if error is not None:
                out.append({"error": str(error)})
                continue
            response = result.get_response()
            final = response.parameters.get("triton_final_response")
            out.append({
                "id": response.id,
                "final": final.bool_param if final is not None else None,
                "outputs": [o.name for o in response.outputs],
                "index": result.as_numpy("INDEX").tolist() if response.outputs else None,
                "text": _b(result.as_numpy("TEXT")) if response.outputs else None,
            })  # fmt: skip
    finally:
        client.stop_stream()
        client.close()
    return out


def types(url: str) -> dict[str, Any]:
    client = triton.InferenceServerClient(url)
    report: dict[str, Any] = {}
    text = triton.InferInput("TEXT", [len(TEXT)], "BYTES")
    text.set_data_from_numpy(np.array(TEXT, dtype=object))
    result = client.infer("demo-strlen", [text], client_timeout=TIMEOUT_S)
    report["strlen"] = {
        "length": result.as_numpy("LENGTH").tolist(),
        "length_datatype": result.get_output("LENGTH").datatype,
        "echo": _b(result.as_numpy("ECHO")),
    }
    x = np.random.default_rng(3).standard_normal((2, 64), dtype=np.float32)
    bf16 = triton.InferInput("INPUT0", [2, 64], "BF16")
    bf16.set_data_from_numpy(x.astype(ml_dtypes.bfloat16))  # as tritonclient >= 2.67 wants it
    result = client.infer("mlp-bf16", [bf16], outputs=[triton.InferRequestedOutput("OUTPUT0")])
    report["bf16"] = {
        "input": x.tolist(),
        "output": result.as_numpy("OUTPUT0").astype(np.float32).tolist(),
        "datatype": result.get_output("OUTPUT0").datatype,
        "metadata": client.get_model_metadata("mlp-bf16", as_json=True),
    }
    report["stream"] = _stream(
        url,
        [dict(model_name="demo-stream", inputs=[_n(5)], request_id="s1", enable_empty_final_response=True)],
        6,
    )
    report["same_ids"] = _stream(
        url,
        [
            dict(model_name="demo-stream", inputs=[_n(3)], request_id="a", parameters={"delay_ms": 5}),
            dict(model_name="demo-stream", inputs=[_n(2)], request_id="a"),  # the same id twice: both run
            dict(model_name="demo-stream", inputs=[_n(4)], request_id="b"),
        ],
        9,
    )
    report["bad_parameter"] = _stream(
        url,
        [dict(model_name="demo-stream", inputs=[_n(2)], request_id="p", parameters={"delay_ms": "soon"})],
        1,
    )
    try:
        client.infer("demo-stream", [_n(2)])
        report["unary_decoupled"] = {"status": "OK"}
    except InferenceServerException as exc:
        report["unary_decoupled"] = _error(exc)
    report["config_stream"] = client.get_model_config("demo-stream", as_json=True)["config"]
    plain = triton.InferInput("TEXT", [1], "BYTES")
    plain.set_data_from_numpy(np.array([b"a"], dtype=object))
    try:
        client.infer("demo-strlen", [plain], parameters={"mcp.features_off": "x"})
        report["reserved_parameter"] = {"status": "OK"}
    except InferenceServerException as exc:
        report["reserved_parameter"] = _error(exc)
    client.close()
    return report


def seq(url: str, sequence_id: int, *, start: bool, end: bool, stream: bool) -> dict[str, Any]:
    x = triton.InferInput("INPUT0", [1, 64], "FP32")
    x.set_data_from_numpy(np.ones((1, 64), np.float32))
    flags = {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}
    if stream:
        (answer,) = _stream(url, [dict(model_name="demo-mlp", inputs=[x], request_id="q", **flags)], 1)
        return {"status": "OK" if "error" not in answer else "ERROR", "message": answer.get("error", "")}
    client = triton.InferenceServerClient(url)
    try:
        client.infer("demo-mlp", [x], client_timeout=TIMEOUT_S, **flags)
        return {"status": "OK", "message": ""}
    except InferenceServerException as exc:
        return _error(exc)
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("types")
    s = sub.add_parser("seq")
    s.add_argument("id", type=int)
    s.add_argument("--start", action="store_true")
    s.add_argument("--end", action="store_true")
    s.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    if args.what == "types":
        report = types(args.url)
    else:
        report = seq(args.url, args.id, start=args.start, end=args.end, stream=args.stream)
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
