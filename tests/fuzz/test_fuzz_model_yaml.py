"""Fuzzing ``model.yaml``: ``parse_model_yaml`` on hostile documents, and a worker asked to load one.

Contract (``mcpcore.model_yaml``): whatever the text, the only exception is ``InvalidArgument`` whose
message names the file and the key path (``model.yaml <model>/<version>: <path>: ...``), bounded in
size; and a worker answers a Load of such a model INVALID_ARGUMENT with that message while it keeps
serving the models it holds.

The documents: the demo MLP's with one value replaced (anywhere in the tree) by a hostile one, keys
dropped or added; arbitrary text; and the demo text with YAML's own hazards spliced in (python tags,
aliases that expand exponentially, deep nesting, huge and non-finite numbers, binary and set values).
"""

from __future__ import annotations

import copy
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from fuzzing import assert_clear, fuzz_settings, hostile_scalars, hostile_text
from harness import TensorClient, mlp_reference, serving_worker
from hypothesis import example, given
from hypothesis import strategies as st

from mcpapi.v2 import worker_pb2
from mcpcore.errors import InvalidArgument
from mcpcore.model_yaml import parse_model_yaml
from mcpcore.modelspec import ModelConfig

DEMO = """\
backend: numpy
max_batch_size: 64
inputs:
  - {name: INPUT0, dtype: FP32, shape: [-1, 64]}
outputs:
  - {name: OUTPUT0, dtype: FP32, shape: [-1, 16]}
dynamic_batching:
  max_queue_delay_us: 500
  preferred_batch_sizes: [16, 32, 64]
  priority_levels: 2
qos: {latency_sensitivity: 0.5}
weights: weights.safetensors
layers:
  - {op: dense, in: 64, out: 256, weight: fc1.weight, bias: fc1.bias}
  - {op: relu}
  - {op: dense, in: 256, out: 16, weight: fc2.weight, bias: fc2.bias}
"""
DEMO_DOC = yaml.safe_load(DEMO)
_WHERE = re.compile(r"^model\.yaml m/1: ")

_scalars = hostile_scalars(
    1 << 200,
    hostile_text(),
    st.sampled_from(["FP32", "numpy", "dense", "-1", "1e400", "0x10", "INPUT0", "OUTPUT0"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(hostile_text(12), st.integers()), inner, max_size=4),
    ),
    max_leaves=12,
)

#: YAML's own hazards, each a value to splice in place of one in the demo text.
_HAZARDS = (
    "!!python/object/apply:os.system ['true']",
    "!!python/name:os.system",
    "!!python/object:builtins.dict {}",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!timestamp 2001-12-14t21:59:43.10-05:00",
    "!!float .nan",
    ".inf",
    "-.inf",
    "1e400",
    "0x7fffffffffffffffffffffffffffffff",
    "99999999999999999999999999999999999999",
    "9" * 5000,  # past Python's int_max_str_digits: int() of it raises ValueError
    "0x" + "f" * 4000,  # parses (base 16 has no digit limit) but cannot be printed in decimal
    "-0x" + "f" * 4000,
    "[-1, 0x" + "f" * 4000 + "]",
    "[" * 200 + "]" * 200,
    "{a: " * 100 + "1" + "}" * 100,
    "&a [x]",
    "*undefined",
    "!custom 1",
    "~",
    "''",
    '"\\0"',
    '"\\uffff"',
)


def _bomb(depth: int) -> str:
    """A flow list whose aliases expand to 10**depth leaves (YAML's "billion laughs")."""
    items = ["&l0 [x, x, x, x, x, x, x, x, x, x]"]
    items += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, depth)]
    return "[" + ", ".join(items) + "]"


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*at, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _paths(value, (*at, i))
    return out


_DEMO_PATHS = _paths(DEMO_DOC)[1:]


def _parse(text: str) -> ModelConfig | None:
    """Parse as the worker does; an error must be the contract's, which this checks (None then)."""
    try:
        return parse_model_yaml(text, model="m", version="1")
    except InvalidArgument as err:
        assert _WHERE.match(err.message), f"an error that does not name the file: {err.message[:300]}"
        assert_clear(err.message, "from parse_model_yaml")
        return None


@fuzz_settings(60)
@given(path=st.sampled_from(_DEMO_PATHS), value=_values, drop=st.booleans())
def test_one_value_replaced(path: tuple[Any, ...], value: Any, drop: bool) -> None:
    doc = copy.deepcopy(DEMO_DOC)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if drop and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    config = _parse(yaml.safe_dump(doc))
    if config is not None:  # what it accepted, it holds as validated values
        assert config.name == "m" and config.inputs and config.outputs


@fuzz_settings(40)
@given(extra=st.dictionaries(hostile_text(16), _values, min_size=1, max_size=3))
def test_unknown_keys_are_named(extra: dict[str, Any]) -> None:
    unknown = {
        k: v for k, v in extra.items() if k not in DEMO_DOC and k not in ModelConfig.__dataclass_fields__
    }
    doc = {**DEMO_DOC, **extra}
    config = _parse(yaml.safe_dump(doc))
    if unknown:
        assert config is None, f"unknown keys {unknown} accepted"


@fuzz_settings(60)
@given(text=st.one_of(st.text(max_size=400), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_any_text(text: str) -> None:
    _parse(text)


@fuzz_settings(40)
@given(line=st.integers(0, DEMO.count("\n") - 1), hazard=st.sampled_from(_HAZARDS))
def test_yaml_hazards_spliced_in(line: int, hazard: str) -> None:
    lines = DEMO.splitlines()
    key, sep, _ = lines[line].partition(":")
    if sep and not key.lstrip().startswith("-"):  # a "key: value" line: the value becomes the hazard
        lines[line] = f"{key}: {hazard}"
    else:
        lines[line] = f"{lines[line].split('{')[0]}{hazard}"
    _parse("\n".join(lines) + "\n")


@pytest.mark.parametrize("key", ["backend", "name", "inputs", "weights", "fallback_version", "priority"])
def test_alias_bomb_is_refused_briefly(key: str) -> None:
    """10**6 leaves behind one value: the error describes it in a few words, never expands it (at depth
    9 a repr of it would take gigabytes)."""
    text = DEMO.replace(f"\n{key}: ", f"\n_{key}: ") + f"{key}: {_bomb(6)}\n"  # the demo's own goes
    text = text.replace(f"\n_{key}: ", f"\n# {key}: ")
    with pytest.raises(InvalidArgument) as caught:
        parse_model_yaml(text, model="m", version="1")
    assert_clear(caught.value.message, f"for a bomb under {key}")
    assert caught.value.message.startswith(f"model.yaml m/1: {key}")


# --- a worker asked to load a hostile model.yaml ---------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_repo(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo repository, copied so that this module can add hostile models to it."""
    out = tmp_path_factory.mktemp("hostile") / "models"
    shutil.copytree(repo / "demo-mlp", out / "demo-mlp")
    return out


@pytest.fixture(scope="module")
def worker(hostile_repo: Path, etcd_endpoint: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with serving_worker(tmp_path_factory.mktemp("w"), etcd_endpoint, hostile_repo, ("demo-mlp",)) as proc:
        yield proc


X = np.random.default_rng(3).random((2, 64), dtype=np.float32)


def _replaced(path: tuple[Any, ...], value: Any) -> str:
    doc = copy.deepcopy(DEMO_DOC)
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return yaml.safe_dump(doc)


@fuzz_settings(6)
@given(
    text=st.one_of(
        st.sampled_from(_HAZARDS).map(lambda h: DEMO.replace("backend: numpy", f"backend: {h}")),
        st.just(DEMO.replace("weights: weights.safetensors\n", f"weights: {_bomb(6)}\n")),
        st.tuples(st.sampled_from(_DEMO_PATHS), _values).map(lambda pv: _replaced(*pv)),
    )
)
@example(text=_replaced(("weights",), "0"))  # a weights file the version lacks (make chaos found it)
def test_worker_refuses_hostile_model_and_keeps_serving(worker, hostile_repo: Path, text: str) -> None:  # type: ignore[no-untyped-def]
    name = f"hostile-{uuid.uuid4().hex[:8]}"  # a fresh model each time: nothing cached decides
    version_dir = hostile_repo / name / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.yaml").write_text(text)
    shutil.copy(hostile_repo / "demo-mlp" / "1" / "weights.safetensors", version_dir)
    control = worker.control()
    try:
        control.Load(worker_pb2.LoadRequest(model=name, version="1"), timeout=30)
    except grpc.RpcError as err:
        details = err.details() or ""
        assert_clear(details, f"loading {name}")
        if err.code() == grpc.StatusCode.NOT_FOUND:
            # `weights` names a file the version does not have (make chaos drew weights: '0'): the
            # repository's own answer for a missing file, as tests/unit/test_repository.py pins it
            assert f"model {name}/1: weights file not found: " in details, details
        else:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), details)
            # it names the model and version: "model.yaml m/1: <key path>: ..." for what the schema
            # refuses, "model m/1 (numpy backend): layers[0] (dense): ..." for a graph its weights file
            # does not fit (make chaos's random run found a weight renamed to a tensor the file lacks)
            assert f"model.yaml {name}/1: " in details or f"model {name}/1 (" in details, details
    else:  # the replacement happened to be valid: then it must be a model that serves
        control.Unload(worker_pb2.UnloadRequest(model=name, version="1"), timeout=30)
    with TensorClient(worker.endpoints["zmq"]) as client:
        reply = client.infer("demo-mlp", {"INPUT0": X}, version="1")
    np.testing.assert_allclose(
        reply.named()["OUTPUT0"], mlp_reference(hostile_repo, "demo-mlp", "1", X), rtol=1e-4, atol=1e-5
    )
    assert worker.proc.poll() is None
