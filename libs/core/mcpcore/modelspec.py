"""What a model version is: its I/O, backend, batching, QoS and layer graph (``ModelConfig``), as the
worker, the router and mcpctl hold it. ``mcpcore.model_yaml`` builds it from a ``model.yaml``, and checks
every rule below there.

Invariants:
- Pure values (frozen dataclasses), no I/O.
- With ``max_batch_size > 0`` the first dim of every tensor is the batch dim and must be -1.
- A layer graph (backends numpy and cuda) has one input and one or more outputs. Layers run in order; each
  reads the previous layer's result, or the result of an earlier layer it names with ``from`` (``name``
  labels a result, the input is named by its tensor name), and ``output: <name>`` makes a result a model
  output (with one output and no ``output`` marks, the last layer is it). Dense layers chain the last dim;
  the other dims pass through unchanged; every layer feeds some output.
- ``qos.secondary_features`` names outputs (never all of them) that breaker level 2 may drop, so the
  layers only they need are skipped (DESIGN.md 7).
- ``idempotent`` (default: true, false for a graph with a stateful ``count`` layer) says whether a request
  that may have run may be sent again after its worker vanished; ``max_ongoing_requests`` bounds the
  requests a router keeps in flight to one replica; ``dynamic_batching.max_queue_size`` defaults to
  ``DEFAULT_MAX_QUEUE_SIZE`` (0 leaves only the worker's own bounds).
- ``backend: builtin`` runs one of the worker's own ``BUILTIN_FUNCTIONS`` (``function:``; no weights, no
  code from the repository). ``decoupled: true`` (Triton's decoupled transaction policy) lets a model
  answer a request with any number of replies; such a model runs each request on its own (no
  ``dynamic_batching``).
- ``device`` is where the model runs: ``cpu`` (numpy, builtin; onnx's default) or ``gpu`` (cuda always;
  onnx through onnxruntime's CUDA execution provider). ``cpu_fallback: true`` (onnx with ``device: gpu``
  only) lets it run on the CPU where no CUDA provider or GPU is present; without it that load fails.
- ``instance_count`` copies of the model run on one worker behind one queue (Triton's instance group):
  each batch takes a free copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mcpcore import dtypes

__all__ = [
    "BACKENDS",
    "BACKEND_DEVICES",
    "BUILTIN_FUNCTIONS",
    "DEFAULT_MAX_ONGOING_REQUESTS",
    "DEFAULT_MAX_QUEUE_SIZE",
    "DEVICES",
    "DTYPES",
    "LAYER_GRAPH_BACKENDS",
    "LAYER_OPS",
    "MAX_INSTANCES",
    "STATEFUL_OPS",
    "DynamicBatching",
    "Layer",
    "ModelConfig",
    "QoS",
    "TensorSpec",
    "layer_reads",
]

BACKENDS = ("numpy", "onnx", "cuda", "builtin")
#: The builtin backend's functions (``function:``): fixed code in the worker, never code from a repository.
BUILTIN_FUNCTIONS = ("strlen", "chunks")
LAYER_GRAPH_BACKENDS = ("numpy", "cuda")
DEVICES = ("cpu", "gpu")
MAX_INSTANCES = 64  # instance_count's ceiling: copies of one model on one worker
#: Where each backend may run (the first is its default).
BACKEND_DEVICES = {"numpy": ("cpu",), "builtin": ("cpu",), "cuda": ("gpu",), "onnx": ("cpu", "gpu")}
LAYER_OPS = ("dense", "relu", "gelu", "softmax", "layernorm", "sleep", "count", "fail")
#: Ops whose result depends on what ran before (a model holding one is not idempotent by default).
STATEFUL_OPS = frozenset({"count"})
DEFAULT_MAX_QUEUE_SIZE = 1024
DEFAULT_MAX_ONGOING_REQUESTS = 256
DTYPES = tuple(sorted(dtypes.NAMES))


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # one of DTYPES
    shape: tuple[int, ...]  # -1 = variable; the first dim is the batch dim when max_batch_size > 0


@dataclass(frozen=True)
class DynamicBatching:
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()  # sorted, each in 1..max_batch_size
    priority_levels: int = 1  # level 1 is served first
    default_priority_level: int = 1
    default_queue_timeout_us: int = 0  # 0 = no timeout
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE  # 0 = only the worker's own bounds


@dataclass(frozen=True)
class QoS:
    latency_sensitivity: float = 0.5  # 0 = throughput first, 1 = latency first
    secondary_features: tuple[str, ...] = ()  # what breaker level 2 may switch off


@dataclass(frozen=True)
class Layer:
    """One step of a layer graph. ``in_dim``/``out_dim`` are YAML's ``in``/``out``; ``weight``/``bias``
    name tensors in the weights file (dense: weight required; layernorm: optional scale and shift)."""

    op: str  # one of LAYER_OPS
    in_dim: int | None = None
    out_dim: int | None = None
    weight: str | None = None
    bias: str | None = None
    eps: float | None = None  # layernorm only; the backend's default when None
    ms: float | None = None  # sleep only
    #: fail only (fault injection, as Envoy's fault filter): a file in the version directory holding the
    #: fraction of batches to fail, read at run time so an operator can change it; never a request's
    ratio_file: str | None = None
    name: str | None = None  # labels this layer's result, for a later layer's ``source``
    source: str | None = None  # YAML's ``from``: the named result this layer reads (default: the previous)
    output: str | None = None  # this layer's result is that model output


@dataclass(frozen=True)
class ModelConfig:
    name: str
    version: str
    backend: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 0
    dynamic_batching: DynamicBatching | None = None
    priority: int = 0
    qos: QoS = field(default_factory=QoS)
    memory_bytes: int = 0  # declared memory for placement; 0 = not declared
    fallback_version: str | None = None
    weights: str | None = None  # a file name in the version directory
    encrypted: bool = False
    key_id: str | None = None
    layers: tuple[Layer, ...] = ()
    instance_count: int = 1
    idempotent: bool = True
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS
    function: str | None = None  # backend builtin: which of BUILTIN_FUNCTIONS
    decoupled: bool = False  # answers a request with any number of replies (Triton's decoupled mode)
    device: str = ""  # where it runs: "cpu" or "gpu" (DEVICES); "": the backend's default
    cpu_fallback: bool = False  # onnx with device gpu: run on the CPU where no GPU can be used

    def __post_init__(self) -> None:
        if not self.device:  # built in code, not from a model.yaml: where its backend runs by default
            object.__setattr__(self, "device", BACKEND_DEVICES.get(self.backend, DEVICES)[0])


def layer_reads(layers: tuple[Layer, ...] | list[Layer], input_name: str) -> tuple[int, ...]:
    """The index of the layer each layer of a checked graph reads (-1: the model input)."""
    names: dict[str, int] = {input_name: -1}
    out, prev = [], -1
    for i, layer in enumerate(layers):
        if layer.source is not None:
            prev = names[layer.source]
        out.append(prev)
        if layer.name is not None:
            names[layer.name] = i
        prev = i
    return tuple(out)
