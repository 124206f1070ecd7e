"""Build the demo model repository (DESIGN §13): ``python tools/make_models.py --out DIR [--force]``.

Every demo model but the two builtin ones is the same small MLP: input ``INPUT0`` FP32 ``[-1, 64]``,
dense 64→256, ReLU, dense 256→16, output ``OUTPUT0`` FP32 ``[-1, 16]``; plus a secondary output ``RANK0``
FP32 ``[-1, 8]`` (a ranking head on the hidden layer: dense 256→64, ReLU, dense 64→8, softmax) that breaker
level 2 drops, saving the head's work. Dense weights are stored ``[in, out]`` (``y = x @ W + b``).

    demo-mlp/1, demo-mlp/2   layer graph (numpy backend), weights.safetensors; seeds 1 and 2
    demo-onnx/1, demo-onnx/2 the same two MLPs, same weights, as model.onnx (onnx backend)
    demo-mlp-enc/1           demo-mlp/1 with its weights AES-256-GCM encrypted (weights.safetensors.enc)
    demo-slow/1              demo-mlp/1 behind a 50 ms sleep layer, max batch 8, 16 requests in flight
                             per copy and router: for timeout and overload tests
    demo-stateful/1          not idempotent: ``INPUT0`` → ``COUNT`` FP32 ``[-1, 1]``, a counter of the
                             rows its worker ran, after 20 ms (at-most-once tests: a request run twice
                             shows, and a fault finds requests mid-execution)
    demo-flaky/1, demo-flaky/2  fault drills: demo-mlp/1 behind a ``fail`` layer whose ratio file
                             ``demo-flaky/1/fault_ratio`` (not written here: absent means no faults) the
                             operator writes to fail that share of batches ("injected fault"); version 2
                             is demo-mlp/2 without one, its static fallback (breaker level 3)
    demo-strlen/1            builtin ``strlen``: ``TEXT`` BYTES ``[-1]`` → ``LENGTH`` INT64 ``[-1]``, each
                             string's length in bytes, and ``ECHO`` BYTES ``[-1]``, the strings back;
                             batches up to 16
    demo-stream/1            builtin ``chunks``, decoupled: ``N`` INT32 ``[1]`` → N answers, answer i
                             holding ``INDEX`` INT32 ``[1]`` = i and ``TEXT`` BYTES ``[1]`` = "chunk i";
                             request parameter ``delay_ms`` paces them
    keyring.json             the demo key, id ``demo-key``, mode 0600
    <model>/<version>/manifest.json  every file of that version with its sha256 and size, and
    index.json               every model and version in ``--out`` (``mcp_worker.repository``): what a remote
                             repository (an http(s):// server or s3:// bucket holding a copy of ``--out``)
                             needs; ``python -m mcp_worker.repository publish DIR`` rewrites both for any
                             folder after it changes

The demo key is derived from a fixed public string, so it is NOT a secret: it exists so that the encrypted
demo loads out of the box. Never use it (or this script's keyring) for a real model; make real keys with
``mcpcore.keyring.generate_key``.

Invariants: no downloads, no clocks, fixed seeds (``np.random.default_rng``): every file is byte-for-byte
the same on every run, except ``demo-mlp-enc/1/weights.safetensors.enc``, whose GCM nonce
``mcpcore.model_encryption`` draws at random per file, as it must, and the manifest that lists it
(``VARYING_FILES``). ``make_models`` returns the sha256 of each file written, keyed by its path relative to
``--out``. Without ``--force`` an existing demo model is an error; with it, only the demo models'
directories, the keyring and ``index.json`` are replaced, never anything else in ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import safetensors.numpy
import yaml
from onnx import TensorProto, helper, numpy_helper

from mcp_worker.repository.manifest import INDEX, MANIFEST, index_document, manifest_document, scan
from mcpcore.keyring import write_keyring
from mcpcore.model_encryption import encrypt_model_bytes

__all__ = [
    "DEMO_KEY_ID", "DEMO_MODELS", "ENCRYPTED_FILES", "FAULT_RATIO_FILE", "VARYING_FILES", "demo_key",
    "make_models", "mlp_weights",
]  # fmt: skip

IN_DIM, HIDDEN, OUT_DIM = 64, 256, 16
RANK_HIDDEN, RANK_DIM = 64, 8
SEEDS = {"1": 1, "2": 2}
DEMO_KEY_ID = "demo-key"
KEYRING = "keyring.json"
DEMO_MODELS = (
    "demo-mlp", "demo-onnx", "demo-mlp-enc", "demo-slow", "demo-stateful", "demo-strlen", "demo-stream",
    "demo-flaky",
)  # fmt: skip
#: The file of ``demo-flaky/1`` that holds its fault ratio (a number in [0, 1]); a drill writes it.
FAULT_RATIO_FILE = "fault_ratio"
#: Files that differ run to run (a random nonce); everything else is deterministic.
ENCRYPTED_FILES = ("demo-mlp-enc/1/weights.safetensors.enc",)
#: ... and with them the manifests that list them.
VARYING_FILES = (*ENCRYPTED_FILES, f"demo-mlp-enc/1/{MANIFEST}")
ONNX_OPSET = 17
ONNX_IR_VERSION = 8  # the IR version of opset 17; onnxruntime 1.31 loads up to IR 11
SLOW_MS = 50.0
_HEADER = "# Generated by tools/make_models.py: do not edit; rerun the script instead.\n"


def demo_key() -> bytes:
    """The demo AES-256 key: public by construction (sha256 of a fixed string). Demo use only."""
    return hashlib.sha256(b"mcpmesh demo-key: public, for the demo models only").digest()


def mlp_weights(seed: int) -> dict[str, np.ndarray]:
    """The demo MLP's tensors for ``seed``: He-scaled normal weights, small biases, float32, ``[in, out]``."""
    rng = np.random.default_rng(seed)

    def layer(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
        w = rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)
        b = rng.standard_normal(n_out) * 0.1
        return w.astype(np.float32), b.astype(np.float32)

    w1, b1 = layer(IN_DIM, HIDDEN)
    w2, b2 = layer(HIDDEN, OUT_DIM)
    r1, c1 = layer(HIDDEN, RANK_HIDDEN)  # drawn after the MLP's, so OUTPUT0's weights do not change
    r2, c2 = layer(RANK_HIDDEN, RANK_DIM)
    return {
        "fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2,
        "rank1.weight": r1, "rank1.bias": c1, "rank2.weight": r2, "rank2.bias": c2,
    }  # fmt: skip


# --- model.yaml ---------------------------------------------------------------------------------------------


def _config(backend: str, weights: str | None, *, max_batch_size: int = 64, **extra: Any) -> dict[str, Any]:
    preferred = [s for s in (16, 32, 64) if s <= max_batch_size] or [max_batch_size]
    config: dict[str, Any] = {
        "backend": backend,
        "max_batch_size": max_batch_size,
        "inputs": [{"name": "INPUT0", "dtype": "FP32", "shape": [-1, IN_DIM]}],
        "outputs": [
            {"name": "OUTPUT0", "dtype": "FP32", "shape": [-1, OUT_DIM]},
            {"name": "RANK0", "dtype": "FP32", "shape": [-1, RANK_DIM]},
        ],
        "dynamic_batching": {
            "max_queue_delay_us": 2000,
            "preferred_batch_sizes": preferred,
            "max_queue_size": 1024,
        },
        # The weights are 81 KiB; the rest is headroom for activations at max batch and runtime buffers.
        "memory_bytes": 1 << 20 if backend == "numpy" else 4 << 20,
        "qos": {"latency_sensitivity": 0.8, "secondary_features": ["RANK0"]},
        "weights": weights,
    }
    config.update(extra)
    if backend == "numpy":
        config["layers"] = _mlp_layers()
    return config


def _mlp_layers() -> list[dict[str, Any]]:
    return [
        {"op": "dense", "in": IN_DIM, "out": HIDDEN, "weight": "fc1.weight", "bias": "fc1.bias"},
        {"op": "relu", "name": "hidden"},
        {"op": "dense", "in": HIDDEN, "out": OUT_DIM, "weight": "fc2.weight", "bias": "fc2.bias",
         "output": "OUTPUT0"},
        {"op": "dense", "from": "hidden", "in": HIDDEN, "out": RANK_HIDDEN, "weight": "rank1.weight",
         "bias": "rank1.bias"},
        {"op": "relu"},
        {"op": "dense", "in": RANK_HIDDEN, "out": RANK_DIM, "weight": "rank2.weight", "bias": "rank2.bias"},
        {"op": "softmax", "output": "RANK0"},
    ]  # fmt: skip


def _yaml(config: dict[str, Any]) -> bytes:
    text = yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=110)
    return (_HEADER + text).encode("utf-8")


# --- weights files ------------------------------------------------------------------------------------------


def _safetensors(tensors: dict[str, np.ndarray]) -> bytes:
    return safetensors.numpy.save(tensors)  # header keys sorted, no metadata: deterministic


def _onnx(tensors: dict[str, np.ndarray], name: str) -> bytes:
    """The layer graph's MatMul/Add/Relu (and the ranking head's Softmax) with the tensors as
    initializers and a dynamic batch dim."""

    def dense(prefix: str, src: str, dst: str) -> list[Any]:
        return [
            helper.make_node(
                "MatMul", [src, f"{prefix}.weight"], [f"{prefix}.matmul"], name=f"{prefix}.matmul"
            ),
            helper.make_node("Add", [f"{prefix}.matmul", f"{prefix}.bias"], [dst], name=f"{prefix}.add"),
        ]

    nodes = [
        *dense("fc1", "INPUT0", "fc1.out"),
        helper.make_node("Relu", ["fc1.out"], ["relu.out"], name="relu"),
        *dense("fc2", "relu.out", "OUTPUT0"),
        *dense("rank1", "relu.out", "rank1.out"),
        helper.make_node("Relu", ["rank1.out"], ["rank.relu"], name="rank.relu"),
        *dense("rank2", "rank.relu", "rank2.out"),
        helper.make_node("Softmax", ["rank2.out"], ["RANK0"], name="rank.softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        inputs=[helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", IN_DIM])],
        outputs=[
            helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", OUT_DIM]),
            helper.make_tensor_value_info("RANK0", TensorProto.FLOAT, ["batch", RANK_DIM]),
        ],
        initializer=[numpy_helper.from_array(array, name=key) for key, array in tensors.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)], producer_name="mcpmesh make_models"
    )
    model.ir_version = ONNX_IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString(deterministic=True)


# --- the repository -----------------------------------------------------------------------------------------


def _files() -> dict[str, bytes]:
    """Every file of the demo repository but the keyring, by path relative to the repository root."""
    files: dict[str, bytes] = {}
    for version, seed in SEEDS.items():
        tensors = mlp_weights(seed)
        fallback = {"fallback_version": "1"} if version != "1" else {}
        files[f"demo-mlp/{version}/weights.safetensors"] = _safetensors(tensors)
        files[f"demo-mlp/{version}/model.yaml"] = _yaml(_config("numpy", "weights.safetensors", **fallback))
        files[f"demo-onnx/{version}/model.onnx"] = _onnx(tensors, f"demo-onnx-{version}")
        files[f"demo-onnx/{version}/model.yaml"] = _yaml(_config("onnx", "model.onnx", **fallback))

    plain = files["demo-mlp/1/weights.safetensors"]
    files["demo-mlp-enc/1/weights.safetensors.enc"] = encrypt_model_bytes(
        plain, key=demo_key(), key_id=DEMO_KEY_ID, model="demo-mlp-enc", version="1"
    )
    enc = _config("numpy", "weights.safetensors.enc", encrypted=True, key_id=DEMO_KEY_ID)
    files["demo-mlp-enc/1/model.yaml"] = _yaml(enc)

    # at most 16 requests in flight per copy from each router (two batches): overload is refused at once
    slow = _config(
        "numpy", "weights.safetensors", max_batch_size=8, qos={"latency_sensitivity": 0.2},
        max_ongoing_requests=16,
    )  # fmt: skip
    slow["layers"] = [{"op": "sleep", "ms": SLOW_MS}, *_mlp_layers()]
    files["demo-slow/1/weights.safetensors"] = plain
    files["demo-slow/1/model.yaml"] = _yaml(slow)

    flaky = _config("numpy", "weights.safetensors", fallback_version="2")
    flaky["layers"] = [{"op": "fail", "ratio_file": FAULT_RATIO_FILE}, *_mlp_layers()]
    files["demo-flaky/1/weights.safetensors"] = plain
    files["demo-flaky/1/model.yaml"] = _yaml(flaky)
    files["demo-flaky/2/weights.safetensors"] = files["demo-mlp/2/weights.safetensors"]
    files["demo-flaky/2/model.yaml"] = _yaml(_config("numpy", "weights.safetensors"))

    stateful = _config("numpy", None, idempotent=False)  # said outright, though a count layer implies it
    stateful.pop("weights")
    stateful["outputs"] = [{"name": "COUNT", "dtype": "FP32", "shape": [-1, 1]}]
    stateful["qos"] = {"latency_sensitivity": 0.8}
    stateful["memory_bytes"] = 64 << 10
    # 20 ms per batch: a fault (kill -9, SIGSTOP) finds requests mid-execution, as it would a real model
    stateful["layers"] = [{"op": "sleep", "ms": 20.0}, {"op": "count"}]
    files["demo-stateful/1/model.yaml"] = _yaml(stateful)
    files["demo-strlen/1/model.yaml"] = _yaml(
        {
            "backend": "builtin",
            "function": "strlen",
            "max_batch_size": 16,
            "inputs": [{"name": "TEXT", "dtype": "BYTES", "shape": [-1]}],
            "outputs": [
                {"name": "LENGTH", "dtype": "INT64", "shape": [-1]},
                {"name": "ECHO", "dtype": "BYTES", "shape": [-1]},
            ],
            "dynamic_batching": {"max_queue_delay_us": 100},
            "memory_bytes": 64 << 10,
        }
    )
    files["demo-stream/1/model.yaml"] = _yaml(
        {
            "backend": "builtin",
            "function": "chunks",
            "decoupled": True,
            "inputs": [{"name": "N", "dtype": "INT32", "shape": [1]}],
            "outputs": [
                {"name": "INDEX", "dtype": "INT32", "shape": [1]},
                {"name": "TEXT", "dtype": "BYTES", "shape": [1]},
            ],
            "memory_bytes": 64 << 10,
        }
    )
    return _with_manifests(files)


def _with_manifests(files: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` and the manifest of each model version among them."""
    versions: dict[tuple[str, str], dict[str, bytes]] = {}
    for rel, data in files.items():
        model, version, name = rel.split("/")
        versions.setdefault((model, version), {})[name] = data
    out = dict(files)
    for (model, version), contents in versions.items():
        out[f"{model}/{version}/{MANIFEST}"] = manifest_document(model, version, contents)
    return out


def make_models(out: Path, *, force: bool = False) -> dict[str, str]:
    """Write the demo repository under ``out``; return ``{relative path: sha256 hex}`` of every file."""
    out = Path(out)
    existing = [name for name in DEMO_MODELS if (out / name).exists()]
    if existing and not force:
        raise FileExistsError(f"{out}: demo models {existing} exist; pass --force to replace them")
    files = _files()  # everything is built before anything is removed
    out.mkdir(parents=True, exist_ok=True)
    for name in existing:
        shutil.rmtree(out / name)
    for rel, data in files.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    write_keyring(out / KEYRING, {DEMO_KEY_ID: demo_key()})  # demo key only: see the module docstring
    files[KEYRING] = (out / KEYRING).read_bytes()
    files[INDEX] = index_document(scan(out))  # every model in --out, the demo's and any others
    (out / INDEX).write_bytes(files[INDEX])
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the model repository directory")
    parser.add_argument("--force", action="store_true", help="replace existing demo models")
    args = parser.parse_args(argv)
    try:
        digests = make_models(args.out, force=args.force)
    except FileExistsError as err:
        print(f"make_models: {err}", file=sys.stderr)
        return 1
    for rel, digest in digests.items():
        print(f"{digest[:16]}  {args.out / rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
