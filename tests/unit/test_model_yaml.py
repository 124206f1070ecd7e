"""mcpcore.model_yaml (into mcpcore.modelspec's types): the demo MLP parses; every invalid model.yaml names
the bad key path; dense chains validate exactly when their dims line up."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpcore import model_yaml, modelspec
from mcpcore.errors import InvalidArgument, NotFound
from mcpcore.model_yaml import load_model_yaml, model_config_from_dict, parse_model_yaml
from mcpcore.modelspec import DynamicBatching, Layer, QoS, TensorSpec

DEMO_MLP = """\
backend: numpy
max_batch_size: 64
inputs:
  - {name: INPUT0, dtype: FP32, shape: [-1, 64]}
outputs:
  - {name: OUTPUT0, dtype: FP32, shape: [-1, 16]}
dynamic_batching:
  max_queue_delay_us: 500
  preferred_batch_sizes: [64, 16, 32]
weights: weights.safetensors
layers:
  - {op: dense, in: 64, out: 256, weight: fc1.weight, bias: fc1.bias}
  - {op: relu}
  - {op: dense, in: 256, out: 16, weight: fc2.weight, bias: fc2.bias}
"""

ONNX = {
    "backend": "onnx",
    "max_batch_size": 8,
    "inputs": [{"name": "INPUT0", "dtype": "FP32", "shape": [-1, 64]}],
    "outputs": [{"name": "OUTPUT0", "dtype": "FP32", "shape": [-1, 16]}],
    "weights": "model.onnx",
}


def demo() -> dict[str, Any]:
    return yaml.safe_load(DEMO_MLP)


def parse(data: dict[str, Any], model: str = "demo-mlp", version: str = "1") -> modelspec.ModelConfig:
    return model_config_from_dict(data, model=model, version=version)


def test_demo_mlp_parses() -> None:
    cfg = parse_model_yaml(DEMO_MLP, model="demo-mlp", version="1")
    assert (cfg.name, cfg.version, cfg.backend, cfg.max_batch_size) == ("demo-mlp", "1", "numpy", 64)
    assert cfg.inputs == (TensorSpec("INPUT0", "FP32", (-1, 64)),)
    assert cfg.outputs == (TensorSpec("OUTPUT0", "FP32", (-1, 16)),)
    assert cfg.dynamic_batching == DynamicBatching(max_queue_delay_us=500, preferred_batch_sizes=(16, 32, 64))
    assert cfg.layers == (
        Layer("dense", in_dim=64, out_dim=256, weight="fc1.weight", bias="fc1.bias"),
        Layer("relu"),
        Layer("dense", in_dim=256, out_dim=16, weight="fc2.weight", bias="fc2.bias", output="OUTPUT0"),
    )  # one output and no marks: the last layer makes it
    assert (cfg.priority, cfg.qos, cfg.memory_bytes, cfg.instance_count) == (0, QoS(), 0, 1)
    assert (cfg.idempotent, cfg.max_ongoing_requests) == (True, modelspec.DEFAULT_MAX_ONGOING_REQUESTS)
    assert cfg.dynamic_batching.max_queue_size == modelspec.DEFAULT_MAX_QUEUE_SIZE  # bounded by default
    assert (cfg.weights, cfg.encrypted, cfg.key_id, cfg.fallback_version) == (
        "weights.safetensors",
        False,
        None,
        None,
    )


def test_docstring_example_is_the_demo_mlp() -> None:
    block = model_yaml.__doc__.split("::\n\n", 1)[1].split("\n\n", 1)[0]  # type: ignore[union-attr]
    text = "\n".join(line[4:] for line in block.splitlines())
    cfg = parse_model_yaml(text, model="demo-mlp", version="1")
    assert cfg.layers == parse_model_yaml(DEMO_MLP, model="demo-mlp", version="1").layers


def test_full_schema() -> None:
    data = demo() | {
        "name": "demo-mlp",
        "priority": 3,
        "qos": {"latency_sensitivity": 0.9, "secondary_features": ["RANK0"]},
        "memory_bytes": 1 << 20,
        "fallback_version": 1,
        "weights": "weights.safetensors.enc",
        "encrypted": True,
        "key_id": "key-2024",
        "instance_count": 2,
        "backend": "cuda",
    }
    data["dynamic_batching"] |= {
        "priority_levels": 3,
        "default_priority_level": 2,
        "default_queue_timeout_us": 100_000,
        "max_queue_size": 128,
    }
    data["outputs"].append({"name": "RANK0", "dtype": "FP32", "shape": [-1, 16]})
    data["layers"][1]["name"] = "hidden"
    data["layers"][2]["output"] = "OUTPUT0"
    data["layers"] += [
        {"op": "dense", "from": "hidden", "in": 256, "out": 16, "weight": "r.weight"},
        {"op": "layernorm", "eps": 1e-5},
        {"op": "gelu"},
        {"op": "softmax"},
        {"op": "sleep", "ms": 2, "output": "RANK0"},
    ]
    data["max_ongoing_requests"] = 32
    cfg = parse(data, version="2")
    assert cfg.fallback_version == "1" and cfg.max_ongoing_requests == 32
    assert cfg.qos == QoS(0.9, ("RANK0",))
    assert (cfg.encrypted, cfg.key_id, cfg.instance_count, cfg.priority) == (True, "key-2024", 2, 3)
    assert cfg.dynamic_batching is not None and cfg.dynamic_batching.default_priority_level == 2
    assert cfg.layers[-1] == Layer("sleep", ms=2.0, output="RANK0")
    assert cfg.layers[-5] == Layer("dense", in_dim=256, out_dim=16, weight="r.weight", source="hidden")
    assert cfg.layers[-4] == Layer("layernorm", eps=1e-5)


def test_onnx_and_no_batching() -> None:
    cfg = parse(copy.deepcopy(ONNX), model="demo-onnx")
    assert cfg.layers == () and cfg.dynamic_batching is None
    unbatched = copy.deepcopy(ONNX) | {"max_batch_size": 0}
    unbatched["inputs"][0]["shape"] = [3, 224, 224]
    assert parse(unbatched, model="demo-onnx").inputs[0].shape == (3, 224, 224)


def test_sleep_only_graph_needs_no_weights() -> None:
    data = demo() | {"layers": [{"op": "sleep", "ms": 50}], "name": "demo-slow"}
    del data["weights"]
    data["outputs"][0]["shape"] = [-1, 64]
    assert parse(data, model="demo-slow").weights is None


def _set(path: str, value: Any) -> Any:
    """A mutation of the demo file: set (or with value ``...`` delete) the dotted/indexed path."""

    def apply(data: dict[str, Any]) -> dict[str, Any]:
        keys: list[Any] = [
            int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")
        ]
        node: Any = data
        for k in keys[:-1]:
            node = node[k]
        if value is ...:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
        return data

    return apply


INVALID = [
    ("dynamic_batching.max_queue_delay_us", -5, "dynamic_batching.max_queue_delay_us: must be >= 0, got -5"),
    ("dynamic_batching.max_queue_delay_us", 1.5, "dynamic_batching.max_queue_delay_us: expected an integer"),
    (
        "dynamic_batching.preferred_batch_sizes",
        [0],
        "dynamic_batching.preferred_batch_sizes[0]: must be >= 1",
    ),
    ("dynamic_batching.preferred_batch_sizes", [65], "preferred_batch_sizes[0]: must be <= 64, got 65"),
    ("dynamic_batching.preferred_batch_sizes", [8, 8], "preferred_batch_sizes: duplicate sizes"),
    ("dynamic_batching.priority_levels", 0, "dynamic_batching.priority_levels: must be >= 1"),
    ("dynamic_batching.default_priority_level", 2, "dynamic_batching.default_priority_level: must be <= 1"),
    (
        "dynamic_batching.default_queue_timeout_us",
        -1,
        "dynamic_batching.default_queue_timeout_us: must be >= 0",
    ),
    ("dynamic_batching.max_queue_size", -1, "dynamic_batching.max_queue_size: must be >= 0"),
    ("dynamic_batching.max_delay", 1, "dynamic_batching.max_delay: unknown key"),
    ("dynamic_batching", [], "dynamic_batching: expected a mapping, got list"),
    ("max_batch_size", -1, "max_batch_size: must be >= 0, got -1"),
    ("max_batch_size", True, "max_batch_size: expected an integer, got bool True"),
    ("backend", "tensorrt", "backend: unknown backend 'tensorrt'"),
    ("backend", ..., "backend: required"),
    ("inputs", ..., "inputs: required"),
    ("inputs", [], "inputs: must list at least one tensor"),
    ("inputs", {"a": 1}, "inputs: expected a list, got dict"),
    ("inputs[0].dtype", "FP8", "inputs[0].dtype: unknown dtype 'FP8'"),
    ("inputs[0].dtype", ["FP32"], "inputs[0].dtype: unknown dtype"),
    ("inputs[0].dtype", "INT32", "inputs[0].dtype: a layer graph computes in FP16/BF16/FP32/FP64, got INT32"),
    ("inputs[0].name", "has space", "inputs[0].name: not a valid tensor name"),
    ("inputs[0].name", "x" * 257, "inputs[0].name: not a valid tensor name"),
    ("inputs[0].name", "", "inputs[0].name: not a valid tensor name"),
    ("inputs[0].shape", [64, 64], "inputs[0].shape: the first dim is the batch dim and must be -1"),
    ("inputs[0].shape", [-1, 0], "inputs[0].shape: dims are -1 (variable) or >= 1"),
    ("inputs[0].shape", [-1, -2], "inputs[0].shape[1]: must be >= -1, got -2"),
    ("inputs[0].shape", [-1, "64"], "inputs[0].shape[1]: expected an integer, got str '64'"),
    ("inputs[0].shape", [-1, -1], "inputs[0].shape: a layer graph needs a fixed last dim"),
    ("inputs[0].shape", [-1, 8, 64], "outputs[0].shape: must match the input's [-1, 8]"),
    ("inputs[0].format", "NCHW", "inputs[0].format: unknown key"),
    ("outputs[0].shape", ..., "outputs[0].shape: required"),
    ("outputs[0].shape", [-1, 32], "layers[2].output: the graph reaches dim 16; OUTPUT0 has last dim 32"),
    ("layers", ..., "layers: expected a list, got NoneType None"),
    ("layers", [], "layers: backend numpy needs a non-empty layer list"),
    ("layers[0].in", 32, "layers[0].in: 32 does not match the incoming dim 64"),
    ("layers[2].in", 128, "layers[2].in: 128 does not match the incoming dim 256"),
    ("layers[0].out", 0, "layers[0].out: must be >= 1, got 0"),
    ("layers[0].weight", ..., "layers[0].weight: required"),
    ("layers[0].weight", "a/b", "layers[0].weight: not a valid name"),
    ("layers[1].op", "tanh", "layers[1].op: unknown layer op 'tanh'"),
    ("layers[1].ms", 5, "layers[1].ms: unknown key"),
    ("layers[1]", "relu", "layers[1]: expected a mapping, got str 'relu'"),
    ("layers[0].stride", 1, "layers[0].stride: unknown key"),
    ("name", "other", "name: 'other' differs from the directory name 'demo-mlp'"),
    ("priority", "high", "priority: expected an integer, got str 'high'"),
    ("qos", {"latency_sensitivity": 1.5}, "qos.latency_sensitivity: must be in 0..1, got 1.5"),
    ("qos", {"latency_sensitivity": float("nan")}, "qos.latency_sensitivity: expected a finite number"),
    ("qos", {"secondary_features": ["a b"]}, "qos.secondary_features[0]: not a valid tensor name"),
    ("qos", {"latency": 1}, "qos.latency: unknown key (did you mean 'latency_sensitivity'?)"),
    ("memory_bytes", -1, "memory_bytes: must be >= 0, got -1"),
    ("fallback_version", "v1", "fallback_version: expected a positive integer version, got str 'v1'"),
    ("fallback_version", 0, "fallback_version: expected a positive integer version"),
    ("fallback_version", "1", "fallback_version: must differ from this version 1"),
    ("weights", ..., "weights: required for backend numpy with dense layers"),
    ("weights", "../w.safetensors", "weights: must be a file name in the version directory"),
    ("weights", "w.safetensors.enc", "encrypted: weights 'w.safetensors.enc' is encrypted (*.enc)"),
    ("encrypted", "yes", "encrypted: expected true or false, got str 'yes'"),
    ("encrypted", True, "key_id: required when encrypted: true"),
    ("key_id", "k1", "key_id: only allowed with encrypted: true"),
    ("instance_count", 0, "instance_count: must be >= 1, got 0"),
    ("max_batch", 8, "max_batch: unknown key (did you mean 'max_batch_size'?)"),
]


@pytest.mark.parametrize(("path", "value", "expected"), INVALID, ids=[f"{p}={v!r}" for p, v, _ in INVALID])
def test_invalid_names_the_field_path(path: str, value: Any, expected: str) -> None:
    data = _set(path, value)(demo())
    with pytest.raises(InvalidArgument) as exc:
        parse(data)
    assert exc.value.message.startswith("model.yaml demo-mlp/1: ")
    assert expected in exc.value.message


def test_batching_needs_a_batch_dim() -> None:
    data = demo() | {"max_batch_size": 0}
    data["inputs"][0]["shape"] = [64]
    data["outputs"][0]["shape"] = [16]
    with pytest.raises(InvalidArgument, match="dynamic_batching: needs max_batch_size > 0"):
        parse(data)
    del data["dynamic_batching"]
    assert parse(data).max_batch_size == 0


def test_onnx_rules() -> None:
    with pytest.raises(InvalidArgument, match="layers: only for backends numpy and cuda, not onnx"):
        parse(ONNX | {"layers": [{"op": "relu"}]}, model="demo-onnx")
    no_weights = {k: v for k, v in ONNX.items() if k != "weights"}
    with pytest.raises(InvalidArgument, match="weights: required for backend onnx"):
        parse(no_weights, model="demo-onnx")


def test_layer_graph_has_one_input_and_output() -> None:
    data = demo()
    data["inputs"].append({"name": "INPUT1", "dtype": "FP32", "shape": [-1, 64]})
    with pytest.raises(InvalidArgument, match="inputs: a layer graph has exactly one, got 2"):
        parse(data)


def test_duplicate_tensor_names() -> None:
    data = copy.deepcopy(ONNX)
    data["outputs"].append(dict(data["outputs"][0]))
    with pytest.raises(InvalidArgument, match=r"outputs\[1\]\.name: duplicate tensor name 'OUTPUT0'"):
        parse(data, model="demo-onnx")


@pytest.mark.parametrize(
    ("model", "version", "needle"),
    [("-bad", "1", "model directory name '-bad'"), ("m", "0", "version directory '0'"), ("m", "v1", "'v1'")],
)
def test_bad_names_from_the_path(model: str, version: str, needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        parse_model_yaml(DEMO_MLP, model=model, version=version)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("backend: [\n", "not valid YAML"),
        ("- 1\n", "top level: expected a mapping, got list"),
        ("", "NoneType"),
    ],
)
def test_not_a_mapping(text: str, needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        parse_model_yaml(text, model="m", version="1")


def test_load_from_repository_layout(tmp_path: Path) -> None:
    vdir = tmp_path / "demo-mlp" / "2"
    vdir.mkdir(parents=True)
    (vdir / "model.yaml").write_text(DEMO_MLP)
    cfg = load_model_yaml(vdir / "model.yaml")
    assert (cfg.name, cfg.version) == ("demo-mlp", "2")
    assert load_model_yaml(vdir) == cfg
    with pytest.raises(NotFound, match="demo-mlp/3"):
        load_model_yaml(tmp_path / "demo-mlp" / "3" / "model.yaml")
    (vdir / "model.yaml").write_text(DEMO_MLP + "name: demo-onnx\n")
    with pytest.raises(InvalidArgument, match=r"model\.yaml demo-mlp/2: name: 'demo-onnx' differs"):
        load_model_yaml(vdir)
    (vdir / "model.yaml").write_bytes(b"\xff\xfe")
    with pytest.raises(InvalidArgument, match="not UTF-8"):
        load_model_yaml(vdir)


_dims = st.integers(min_value=1, max_value=8)
_activation = st.sampled_from([{"op": "relu"}, {"op": "gelu"}, {"op": "softmax"}, {"op": "layernorm"}])


@settings(max_examples=200, deadline=None)
@given(
    in_dim=_dims,
    out_dim=_dims,
    steps=st.lists(st.one_of(st.tuples(_dims, _dims), _activation), max_size=6),
)
def test_dense_chains_validate_iff_dims_match(
    in_dim: int, out_dim: int, steps: list[tuple[int, int] | dict[str, str]]
) -> None:
    layers: list[dict[str, Any]] = []
    dim, consistent = in_dim, True
    for step in steps:
        if isinstance(step, dict):
            layers.append(step)
            continue
        a, b = step
        layers.append({"op": "dense", "in": a, "out": b, "weight": f"w{len(layers)}"})
        consistent = consistent and a == dim
        dim = b
    consistent = consistent and dim == out_dim and bool(layers)
    data = demo() | {"layers": layers}
    data["inputs"][0]["shape"] = [-1, in_dim]
    data["outputs"][0]["shape"] = [-1, out_dim]
    if consistent:
        assert len(parse(data).layers) == len(layers)
    else:
        with pytest.raises(InvalidArgument, match=r"layers"):
            parse(data)
