"""Many Triton clients that all number their requests "0", "1", ...: does each get its own answer?

Usage: ``python triton_same_ids.py HOST:PORT REPO --clients 16 --requests 200``. Each client thread has its
own ``tritonclient.grpc`` client and inputs of its own; every answer is compared with demo-mlp/1 computed
from the weights file, and its echoed id with the one sent. Prints one JSON line: ok, wrong (another
request's tensors or id), failed (with the first messages). Its own process: tritonclient's generated
``inference`` protos cannot share a process with ours.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

import numpy as np
import safetensors.numpy
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("repo", type=Path)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    w = safetensors.numpy.load_file(str(args.repo / "demo-mlp" / "1" / "weights.safetensors"))
    report = {"ok": 0, "wrong": 0, "failed": 0, "messages": []}
    lock = threading.Lock()

    def client(c: int) -> None:
        rng = np.random.default_rng(1000 + c)
        with triton.InferenceServerClient(args.target) as server:
            for n in range(args.requests):
                x = rng.standard_normal((1, 64), dtype=np.float32)
                want = np.maximum(x @ w["fc1.weight"] + w["fc1.bias"], 0) @ w["fc2.weight"] + w["fc2.bias"]
                tensor = triton.InferInput("INPUT0", [1, 64], "FP32")
                tensor.set_data_from_numpy(x)
                try:
                    result = server.infer("demo-mlp", [tensor], model_version="1", request_id=str(n))
                except InferenceServerException as exc:
                    with lock:
                        report["failed"] += 1
                        report["messages"].append(f"{exc.status()}: {exc.message()}")
                    continue
                got = result.as_numpy("OUTPUT0")
                good = result.get_response().id == str(n) and np.allclose(got, want, rtol=1e-4, atol=1e-4)
                with lock:
                    report["ok" if good else "wrong"] += 1

    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report["messages"] = report["messages"][:5]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
