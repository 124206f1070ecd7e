"""The ``model.yaml`` reader: one model version's file checked and built into a ``modelspec.ModelConfig``.

A model repository is ``<repo>/<model>/<version>/model.yaml`` plus its weights file; the model name and
version come from the path. The demo MLP (DESIGN §13)::

    backend: numpy
    max_batch_size: 64
    inputs:
      - {name: INPUT0, dtype: FP32, shape: [-1, 64]}
    outputs:
      - {name: OUTPUT0, dtype: FP32, shape: [-1, 16]}
    dynamic_batching:
      max_queue_delay_us: 500
      preferred_batch_sizes: [16, 32, 64]
    weights: weights.safetensors
    layers:
      - {op: dense, in: 64, out: 256, weight: fc1.weight, bias: fc1.bias}
      - {op: relu}
      - {op: dense, in: 256, out: 16, weight: fc2.weight, bias: fc2.bias}

Invariants:
- A ``ModelConfig`` is valid once built: every rule of ``mcpcore.modelspec`` and ``mcpcore.layer_graph``
  is checked in ``model_config_from_dict``, and every violation is an ``InvalidArgument`` naming the key
  path, e.g. ``model.yaml demo-mlp/1: dynamic_batching.max_queue_delay_us: must be >= 0, got -5``.
  Unknown keys are errors. No I/O but ``load_model_yaml`` reading its one file; parsing the demo file
  takes well under 5 ms.
"""

from __future__ import annotations

import difflib
import math
import reprlib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, NoReturn

import yaml

from mcpcore import dtypes
from mcpcore.errors import InvalidArgument, NotFound
from mcpcore.keys import NAME_RE, VERSION_RE
from mcpcore.layer_graph import check_graph
from mcpcore.modelspec import (
    BACKEND_DEVICES,
    BACKENDS,
    BUILTIN_FUNCTIONS,
    DEFAULT_MAX_ONGOING_REQUESTS,
    DEVICES,
    DTYPES,
    LAYER_GRAPH_BACKENDS,
    LAYER_OPS,
    MAX_INSTANCES,
    STATEFUL_OPS,
    DynamicBatching,
    Layer,
    ModelConfig,
    QoS,
    TensorSpec,
)
from mcpcore.tensor_signature import tensor_name_problem

__all__ = ["load_model_yaml", "model_config_from_dict", "parse_model_yaml"]

_MAX_FILE_BYTES = 1 << 20
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_INT64_MAX = (1 << 63) - 1
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, 80, 80, 40


class _Ctx:
    """Where errors point: ``model.yaml <model>/<version>: <key path>: <what is wrong>``."""

    def __init__(self, model: str, version: str) -> None:
        self.where = f"model.yaml {model}/{version}"

    def fail(self, path: str, msg: str) -> NoReturn:
        raise InvalidArgument(f"{self.where}: {path or 'top level'}: {msg}")

    def mapping(self, path: str, value: Any, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> Any:
        if not isinstance(value, Mapping):
            self.fail(path, f"expected a mapping, got {_show(value)}")
        for key in value:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.5)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; allowed: {', '.join(allowed)}"
                self.fail(_join(path, str(key)), f"unknown key{hint}")
        for key in required:
            if key not in value:
                self.fail(_join(path, key), "required")
        return value

    def int_(self, path: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected an integer, got {_show(value)}")
        if not -_INT64_MAX - 1 <= value <= _INT64_MAX:  # later messages print it: keep it printable
            self.fail(path, f"out of range: {_brief(value)} does not fit in 64 bits")
        if lo is not None and value < lo:
            self.fail(path, f"must be >= {lo}, got {_brief(value)}")
        if hi is not None and value > hi:
            self.fail(path, f"must be <= {hi}, got {_brief(value)}")
        return value

    def float_(self, path: str, value: Any, lo: float, hi: float | None = None) -> float:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _INT64_MAX:
            value = float(value)  # a larger int overflows a float (math.isfinite raises on it)
        if not isinstance(value, float) or not math.isfinite(value):
            self.fail(path, f"expected a finite number, got {_show(value)}")
        if value < lo or (hi is not None and value > hi):
            self.fail(path, f"must be in {lo}..{hi}, got {value}" if hi is not None else f"must be >= {lo}")
        return float(value)

    def bool_(self, path: str, value: Any) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false, got {_show(value)}")
        return value

    def name(self, path: str, value: Any) -> str:
        if not isinstance(value, str) or not NAME_RE.fullmatch(value):
            self.fail(path, f"not a valid name: {_show(value)} (letters, digits, '_', '.', '-'; max 128)")
        return value

    def tensor_name(self, path: str, value: Any) -> str:
        if problem := tensor_name_problem(value):
            self.fail(path, problem)
        return value  # type: ignore[no-any-return]

    def list_(self, path: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            self.fail(path, f"expected a list, got {_show(value)}")
        return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _brief(value: Any) -> str:
    """A value in an error message, cut short: YAML aliases can make a small file's value expand to
    gigabytes (10 nested lists of 10 aliases each), so no message holds a full repr."""
    try:
        return _REPR.repr(value)
    except ValueError:  # an integer past Python's int_max_str_digits (4300) cannot be printed at all
        return f"an integer of {value.bit_length()} bits" if isinstance(value, int) else "a huge value"


def _show(value: Any) -> str:
    if isinstance(value, (Mapping, list)):
        return type(value).__name__
    return f"{type(value).__name__} {_brief(value)}"


# --- the schema --------------------------------------------------------------------------------------------

_TOP_KEYS = tuple(f.name for f in fields(ModelConfig) if f.name != "version")  # version: from the path
_BATCHING_KEYS = tuple(f.name for f in fields(DynamicBatching))
_LAYER_KEYS = {"dense": ("op", "in", "out", "weight", "bias"), "relu": ("op",), "gelu": ("op",)}
_LAYER_KEYS |= {"softmax": ("op",), "layernorm": ("op", "weight", "bias", "eps"), "sleep": ("op", "ms")}
_LAYER_KEYS |= {"count": ("op",), "fail": ("op", "ratio_file")}
_LAYER_KEYS = {op: (*keys, "name", "from", "output") for op, keys in _LAYER_KEYS.items()}
_ALL_LAYER_KEYS = tuple(dict.fromkeys(k for keys in _LAYER_KEYS.values() for k in keys))
_LAYER_REQUIRED = {"dense": ("in", "out", "weight"), "sleep": ("ms",), "fail": ("ratio_file",)}


def _tensors(ctx: _Ctx, key: str, value: Any, max_batch_size: int) -> tuple[TensorSpec, ...]:
    items = ctx.list_(key, value)
    if not items:
        ctx.fail(key, "must list at least one tensor")
    out: list[TensorSpec] = []
    for i, item in enumerate(items):
        path = f"{key}[{i}]"
        ctx.mapping(path, item, ("name", "dtype", "shape"), ("name", "dtype", "shape"))
        name = ctx.tensor_name(f"{path}.name", item["name"])
        if any(t.name == name for t in out):
            ctx.fail(f"{path}.name", f"duplicate tensor name {name!r}")
        dtype = item["dtype"]
        if not isinstance(dtype, str) or dtype not in dtypes.NAMES:
            ctx.fail(f"{path}.dtype", f"unknown dtype {_brief(dtype)}; one of {', '.join(DTYPES)}")
        dims = ctx.list_(f"{path}.shape", item["shape"])
        shape = tuple(ctx.int_(f"{path}.shape[{j}]", d, lo=-1) for j, d in enumerate(dims))
        if 0 in shape:
            ctx.fail(f"{path}.shape", f"dims are -1 (variable) or >= 1, got {list(shape)}")
        if max_batch_size > 0 and (not shape or shape[0] != -1):
            ctx.fail(f"{path}.shape", f"the first dim is the batch dim and must be -1, got {list(shape)}")
        out.append(TensorSpec(name, dtype, shape))
    return tuple(out)


def _batching(ctx: _Ctx, value: Any, max_batch_size: int) -> DynamicBatching:
    p = "dynamic_batching"
    ctx.mapping(p, value if value is not None else {}, _BATCHING_KEYS)
    if max_batch_size == 0:
        ctx.fail(p, "needs max_batch_size > 0")
    d = DynamicBatching()
    get = (value or {}).get
    sizes = [
        ctx.int_(f"{p}.preferred_batch_sizes[{i}]", s, lo=1, hi=max_batch_size)
        for i, s in enumerate(ctx.list_(f"{p}.preferred_batch_sizes", get("preferred_batch_sizes", [])))
    ]
    if len(set(sizes)) != len(sizes):
        ctx.fail(f"{p}.preferred_batch_sizes", f"duplicate sizes in {sizes}")
    levels = ctx.int_(f"{p}.priority_levels", get("priority_levels", d.priority_levels), lo=1)
    level = ctx.int_(f"{p}.default_priority_level", get("default_priority_level", 1), lo=1, hi=levels)
    counts = ("max_queue_delay_us", "default_queue_timeout_us", "max_queue_size")  # 0 = none / unbounded
    ints = {k: ctx.int_(f"{p}.{k}", get(k, getattr(d, k)), lo=0) for k in counts}
    return DynamicBatching(
        preferred_batch_sizes=tuple(sorted(sizes)),
        priority_levels=levels,
        default_priority_level=level,
        **ints,
    )


def _qos(ctx: _Ctx, value: Any) -> QoS:
    ctx.mapping("qos", value, ("latency_sensitivity", "secondary_features"))
    features = ctx.list_("qos.secondary_features", value.get("secondary_features", []))
    return QoS(
        latency_sensitivity=ctx.float_(
            "qos.latency_sensitivity", value.get("latency_sensitivity", 0.5), 0, 1
        ),
        secondary_features=tuple(
            ctx.tensor_name(f"qos.secondary_features[{i}]", f) for i, f in enumerate(features)
        ),
    )


def _layer(ctx: _Ctx, path: str, item: Any) -> Layer:
    ctx.mapping(path, item, _ALL_LAYER_KEYS, ("op",))
    op = item["op"]
    if not isinstance(op, str) or op not in _LAYER_KEYS:
        ctx.fail(f"{path}.op", f"unknown layer op {_brief(op)}; one of {', '.join(LAYER_OPS)}")
    ctx.mapping(path, item, _LAYER_KEYS[op], _LAYER_REQUIRED.get(op, ()))
    tensor = {k: ctx.name(f"{path}.{k}", item[k]) for k in ("weight", "bias") if k in item}
    refs = {k: ctx.tensor_name(f"{path}.{k}", item[k]) for k in ("name", "from", "output") if k in item}
    return Layer(
        op=op,
        in_dim=ctx.int_(f"{path}.in", item["in"], lo=1) if "in" in item else None,
        out_dim=ctx.int_(f"{path}.out", item["out"], lo=1) if "out" in item else None,
        weight=tensor.get("weight"),
        bias=tensor.get("bias"),
        eps=ctx.float_(f"{path}.eps", item["eps"], 0.0) if "eps" in item else None,
        ms=ctx.float_(f"{path}.ms", item["ms"], 0.0) if "ms" in item else None,
        # a plain name (mcpcore.keys.NAME_RE: no '/', no leading '.'): a file of the version directory
        ratio_file=ctx.name(f"{path}.ratio_file", item["ratio_file"]) if "ratio_file" in item else None,
        name=refs.get("name"),
        source=refs.get("from"),
        output=refs.get("output"),
    )


def _weights(ctx: _Ctx, data: Mapping[str, Any], backend: str, layers: tuple[Layer, ...]) -> tuple[Any, ...]:
    weights = data.get("weights")
    if weights is not None and (not isinstance(weights, str) or not NAME_RE.fullmatch(weights)):
        ctx.fail("weights", f"must be a file name in the version directory, got {_show(weights)}")
    encrypted = ctx.bool_("encrypted", data.get("encrypted", False))
    key_id = data.get("key_id")
    if encrypted:
        if weights is None:
            ctx.fail("weights", "required when encrypted: true")
        if key_id is None:
            ctx.fail("key_id", "required when encrypted: true")
        ctx.name("key_id", key_id)
    elif key_id is not None:
        ctx.fail("key_id", "only allowed with encrypted: true")
    elif weights is not None and weights.endswith(".enc"):
        ctx.fail("encrypted", f"weights {weights!r} is encrypted (*.enc): set encrypted: true and key_id")
    needs = backend == "onnx" or any(layer.weight for layer in layers)
    if needs and weights is None:
        ctx.fail("weights", f"required for backend {backend}" + (" with dense layers" if layers else ""))
    return weights, encrypted, key_id


def _layer_graph(
    ctx: _Ctx,
    data: Mapping[str, Any],
    backend: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
) -> tuple[Layer, ...]:
    if backend not in LAYER_GRAPH_BACKENDS:
        if "layers" in data:
            ctx.fail("layers", f"only for backends {' and '.join(LAYER_GRAPH_BACKENDS)}, not {backend}")
        return ()
    items = ctx.list_("layers", data.get("layers"))
    if not items:
        ctx.fail("layers", f"backend {backend} needs a non-empty layer list")
    layers = tuple(_layer(ctx, f"layers[{i}]", item) for i, item in enumerate(items))
    if len(inputs) != 1:
        ctx.fail("inputs", f"a layer graph has exactly one, got {len(inputs)}")
    return check_graph(ctx.fail, layers, inputs[0], outputs)


def _fallback(ctx: _Ctx, value: Any, version: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # YAML reads `fallback_version: 1` as an int
    if not isinstance(value, str) or not VERSION_RE.fullmatch(value):
        ctx.fail("fallback_version", f"expected a positive integer version, got {_show(value)}")
    if value == version:
        ctx.fail("fallback_version", f"must differ from this version {version}")
    return value


def model_config_from_dict(data: Any, *, model: str, version: str) -> ModelConfig:
    """Validate a parsed ``model.yaml`` (any mapping) for ``model``/``version`` and build its config."""
    ctx = _Ctx(model, version)
    if not NAME_RE.fullmatch(model):
        ctx.fail("name", f"model directory name {model!r} is not a valid model name")
    if not VERSION_RE.fullmatch(version):
        ctx.fail("version", f"version directory {version!r} is not a positive integer")
    ctx.mapping("", data, _TOP_KEYS, ("backend", "inputs", "outputs"))
    if data.get("name", model) != model:
        ctx.fail("name", f"{_brief(data['name'])} differs from the directory name {model!r}")
    backend = data["backend"]
    if backend not in BACKENDS:
        ctx.fail("backend", f"unknown backend {_brief(backend)}; one of {', '.join(BACKENDS)}")
    mbs = ctx.int_("max_batch_size", data.get("max_batch_size", 0), lo=0)
    inputs = _tensors(ctx, "inputs", data["inputs"], mbs)
    outputs = _tensors(ctx, "outputs", data["outputs"], mbs)
    layers = _layer_graph(ctx, data, backend, inputs, outputs)
    weights, encrypted, key_id = _weights(ctx, data, backend, layers)
    batching = data.get("dynamic_batching")
    qos = _qos(ctx, data["qos"]) if data.get("qos") is not None else QoS()
    _check_secondary(ctx, qos, outputs)
    function = _function(ctx, data, backend)
    decoupled = ctx.bool_("decoupled", data.get("decoupled", False))
    if decoupled and backend != "builtin":
        ctx.fail(
            "decoupled", f"backend {backend} answers once per request; only builtin models are decoupled"
        )
    if decoupled and "dynamic_batching" in data:
        ctx.fail("decoupled", "a decoupled model runs each request on its own: drop dynamic_batching")
    device, cpu_fallback = _device(ctx, data, backend)
    stateful = any(layer.op in STATEFUL_OPS for layer in layers)
    idempotent = ctx.bool_("idempotent", data.get("idempotent", not stateful))
    if idempotent and stateful:
        ctx.fail("idempotent", "a graph with a stateful layer (count) cannot be idempotent")
    return ModelConfig(
        name=model,
        version=version,
        backend=backend,
        inputs=inputs,
        outputs=outputs,
        max_batch_size=mbs,
        dynamic_batching=_batching(ctx, batching, mbs) if "dynamic_batching" in data else None,
        priority=ctx.int_("priority", data.get("priority", 0)),
        qos=qos,
        memory_bytes=ctx.int_("memory_bytes", data.get("memory_bytes", 0), lo=0),
        fallback_version=_fallback(ctx, data.get("fallback_version"), version),
        weights=weights,
        encrypted=encrypted,
        key_id=key_id,
        layers=layers,
        instance_count=ctx.int_("instance_count", data.get("instance_count", 1), lo=1, hi=MAX_INSTANCES),
        idempotent=idempotent,
        max_ongoing_requests=ctx.int_(
            "max_ongoing_requests", data.get("max_ongoing_requests", DEFAULT_MAX_ONGOING_REQUESTS), lo=1
        ),
        function=function,
        decoupled=decoupled,
        device=device,
        cpu_fallback=cpu_fallback,
    )


def _device(ctx: _Ctx, data: Mapping[str, Any], backend: str) -> tuple[str, bool]:
    allowed = BACKEND_DEVICES[backend]
    device = data.get("device", allowed[0])
    if device not in DEVICES:
        ctx.fail("device", f"one of {', '.join(DEVICES)}, got {_show(device)}")
    if device not in allowed:
        other = (
            "cuda (the same layer graph on a GPU)"
            if backend == "numpy"
            else "numpy (the same graph on the CPU)"
        )
        hint = f"; backend {other}" if backend in LAYER_GRAPH_BACKENDS else ""
        ctx.fail("device", f"backend {backend} runs on {' or '.join(allowed)} only, not {device}{hint}")
    fallback = ctx.bool_("cpu_fallback", data.get("cpu_fallback", False))
    if fallback and (backend != "onnx" or device != "gpu"):
        ctx.fail("cpu_fallback", "only for backend onnx with device: gpu")
    return device, fallback


def _function(ctx: _Ctx, data: Mapping[str, Any], backend: str) -> str | None:
    value = data.get("function")
    if backend != "builtin":
        if value is not None:
            ctx.fail("function", f"only for backend builtin, not {backend}")
        return None
    if value not in BUILTIN_FUNCTIONS:
        ctx.fail(
            "function", f"backend builtin needs one of {', '.join(BUILTIN_FUNCTIONS)}, got {_show(value)}"
        )
    return str(value)


def _check_secondary(ctx: _Ctx, qos: QoS, outputs: tuple[TensorSpec, ...]) -> None:
    names = [o.name for o in outputs]
    for i, feature in enumerate(qos.secondary_features):
        if feature not in names:
            ctx.fail(f"qos.secondary_features[{i}]", f"{feature!r} is not one of the outputs {names}")
    if qos.secondary_features and set(names) <= set(qos.secondary_features):
        ctx.fail("qos.secondary_features", "at least one output must stay primary")


def parse_model_yaml(text: str, *, model: str, version: str) -> ModelConfig:
    """Parse and validate the text of ``<model>/<version>/model.yaml``."""
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506  _Loader is yaml's CSafeLoader or SafeLoader
    except yaml.YAMLError as err:
        raise InvalidArgument(f"model.yaml {model}/{version}: not valid YAML: {err}") from None
    except ValueError:  # Python refuses to convert a decimal integer of over 4300 digits
        raise InvalidArgument(f"model.yaml {model}/{version}: an integer has too many digits") from None
    return model_config_from_dict(data, model=model, version=version)


def load_model_yaml(path: str | Path) -> ModelConfig:
    """Load ``<repo>/<model>/<version>/model.yaml`` (or its version directory); model and version come from
    the path. A missing file is ``NotFound``; anything wrong inside it is ``InvalidArgument``."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.yaml"
    model, version = path.parent.parent.name, path.parent.name
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise NotFound(f"model.yaml {model}/{version}: no such file: {path}") from None
    except OSError as err:
        raise InvalidArgument(f"model.yaml {model}/{version}: cannot read {path}: {err.strerror}") from None
    if len(raw) > _MAX_FILE_BYTES:
        raise InvalidArgument(f"model.yaml {model}/{version}: larger than {_MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidArgument(f"model.yaml {model}/{version}: not UTF-8: {err}") from None
    return parse_model_yaml(text, model=model, version=version)
