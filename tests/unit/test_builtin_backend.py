"""The builtin backend (demo-strlen's strlen, demo-stream's chunks), decoupled models in model.yaml and
BF16 layer graphs, from real model.yaml documents through ``create_backend``."""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from mcp_worker.backends import create_backend
from mcp_worker.batching import BatchConfig
from mcpcore.errors import InvalidArgument
from mcpcore.model_yaml import model_config_from_dict

STRLEN = {
    "backend": "builtin", "function": "strlen", "max_batch_size": 16,
    "inputs": [{"name": "TEXT", "dtype": "BYTES", "shape": [-1]}],
    "outputs": [
        {"name": "LENGTH", "dtype": "INT64", "shape": [-1]},
        {"name": "ECHO", "dtype": "BYTES", "shape": [-1]},
    ],
}  # fmt: skip
CHUNKS = {
    "backend": "builtin", "function": "chunks", "decoupled": True,
    "inputs": [{"name": "N", "dtype": "INT32", "shape": [1]}],
    "outputs": [
        {"name": "INDEX", "dtype": "INT32", "shape": [1]}, {"name": "TEXT", "dtype": "BYTES", "shape": [1]},
    ],
}  # fmt: skip


def _backend(doc: dict[str, Any], weights: bytes | None = None):  # type: ignore[no-untyped-def]
    return create_backend(model_config_from_dict(doc, model="m", version="1"), weights)


def _text(*values: bytes) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def test_strlen_counts_bytes_and_echoes_them():
    backend = _backend(STRLEN)
    backend.warmup()  # BYTES inputs warm up on empty strings
    out = backend.infer({"TEXT": _text(b"abc", "\u00e9".encode(), b"", b"\x00\xff")})
    assert out["LENGTH"].dtype == np.int64 and out["LENGTH"].tolist() == [3, 2, 0, 2]
    assert out["ECHO"].tolist() == [b"abc", b"\xc3\xa9", b"", b"\x00\xff"]


def test_chunks_answers_n_times_through_emit_and_reads_its_parameter():
    backend = _backend(CHUNKS)
    got: list[dict[str, np.ndarray]] = []
    last = backend.infer({"N": np.array([3], np.int32)}, parameters={"delay_ms": "0"}, emit=got.append)
    assert last == {}
    assert [a["INDEX"].tolist() for a in got] == [[0], [1], [2]]
    assert [a["TEXT"].tolist() for a in got] == [[b"chunk 0"], [b"chunk 1"], [b"chunk 2"]]
    with pytest.raises(InvalidArgument, match=r"request parameter delay_ms must be an integer in 0\.\.10000"):
        backend.infer({"N": np.array([1], np.int32)}, parameters={"delay_ms": "-3"}, emit=got.append)
    with pytest.raises(InvalidArgument, match=r"input N must be one number in 0\.\.1024"):
        backend.infer({"N": np.array([5000], np.int32)}, emit=got.append)
    assert len(got) == 3  # a refused request answers nothing


def test_a_decoupled_model_runs_each_request_alone():
    batched = {
        **CHUNKS, "max_batch_size": 8,
        "inputs": [{"name": "N", "dtype": "INT32", "shape": [-1, 1]}],
        "outputs": [{"name": "INDEX", "dtype": "INT32", "shape": [-1, 1]}],
    }  # fmt: skip
    config = model_config_from_dict(batched, model="m", version="1")
    assert config.decoupled and BatchConfig.from_model_config(config).max_batch_size == 0
    assert BatchConfig.from_model_config(model_config_from_dict({**batched, "decoupled": False}, model="m",
                                                                version="1")).max_batch_size == 8  # fmt: skip


def test_only_builtin_models_are_decoupled():
    doc = {
        "backend": "onnx", "decoupled": True, "weights": "model.onnx",
        "inputs": [{"name": "X", "dtype": "FP32", "shape": [1]}],
        "outputs": [{"name": "Y", "dtype": "FP32", "shape": [1]}],
    }  # fmt: skip
    with pytest.raises(InvalidArgument, match="backend onnx answers once per request"):
        model_config_from_dict(doc, model="m", version="1")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"function": "sum"}, "backend builtin needs one of strlen, chunks, got str 'sum'"),
        ({"function": None}, "backend builtin needs one of strlen, chunks"),
        ({"inputs": [{"name": "TEXT", "dtype": "FP32", "shape": [-1]}]}, "strlen takes one BYTES input"),
        ({"outputs": [{"name": "LENGTH", "dtype": "INT64", "shape": [-1, 2]}]}, "must be its input's [-1]"),
        ({"decoupled": True}, "strlen answers once: drop decoupled"),
    ],
)
def test_strlen_signature_is_checked_at_load(change, words):
    with pytest.raises(InvalidArgument, match=re.escape(words)):
        _backend({**{k: v for k, v in STRLEN.items() if k not in change or change[k] is not None}, **{
            k: v for k, v in change.items() if v is not None
        }})  # fmt: skip


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"decoupled": False}, "chunks answers several times: set decoupled: true"),
        (
            {"outputs": [{"name": "INDEX", "dtype": "INT32", "shape": [1]}]},
            "makes outputs INDEX (INT32) and TEXT",
        ),
        ({"dynamic_batching": {}}, "a decoupled model runs each request on its own: drop dynamic_batching"),
    ],
)
def test_chunks_and_decoupled_rules_are_checked_at_load(change, words):
    with pytest.raises(InvalidArgument, match=re.escape(words)):
        _backend({**CHUNKS, **change})


def test_function_is_only_for_the_builtin_backend():
    doc = {
        "backend": "onnx", "function": "strlen", "weights": "model.onnx",
        "inputs": [{"name": "X", "dtype": "FP32", "shape": [1]}],
        "outputs": [{"name": "Y", "dtype": "FP32", "shape": [1]}],
    }  # fmt: skip
    with pytest.raises(InvalidArgument, match="function: only for backend builtin, not onnx"):
        model_config_from_dict(doc, model="m", version="1")


def test_a_layer_graph_computes_in_bf16():
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((4, 3), dtype=np.float32), rng.standard_normal(3, dtype=np.float32)
    doc = {
        "backend": "numpy", "max_batch_size": 4, "weights": "w.safetensors",
        "inputs": [{"name": "X", "dtype": "BF16", "shape": [-1, 4]}],
        "outputs": [{"name": "Y", "dtype": "BF16", "shape": [-1, 3]}],
        "layers": [{"op": "dense", "in": 4, "out": 3, "weight": "w", "bias": "b"}, {"op": "relu"}],
    }  # fmt: skip
    backend = _backend(doc, safetensors.numpy.save({"w": w, "b": b}))
    x = rng.standard_normal((2, 4), dtype=np.float32).astype(ml_dtypes.bfloat16)
    y = backend.infer({"X": x})["Y"]
    assert y.dtype == ml_dtypes.bfloat16 and y.shape == (2, 3)
    bf = ml_dtypes.bfloat16
    expected = np.maximum(
        x.astype(np.float32) @ w.astype(bf).astype(np.float32) + b.astype(bf).astype(np.float32), 0
    )
    np.testing.assert_allclose(y.astype(np.float32), expected, rtol=0.02, atol=0.02)
