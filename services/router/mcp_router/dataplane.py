"""The router's transport-neutral data plane: what the v1, v2 and KServe V2 front ends adapt to.

The front ends convert protobuf to these values and back and hold no logic; ``Router`` (router.py)
implements this interface over the etcd-fed snapshot and the ZeroMQ forwarder.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from mcp_router.trace import Trace

__all__ = [
    "BatchSizeStats",
    "Batching",
    "DataPlane",
    "Duration",
    "InferResult",
    "ModelConfigInfo",
    "ModelIndexEntry",
    "ModelMetadata",
    "ModelStats",
    "RouteDecision",
    "SequenceFlags",
    "TensorMeta",
]


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str  # Triton style: "FP32"
    shape: tuple[int, ...]  # -1 = variable


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]  # versions that can serve now
    platform: str  # the backend, e.g. "numpy" or "onnx"
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]


@dataclass(frozen=True)
class Batching:
    """A model's dynamic batching, as its model.yaml says."""

    max_queue_delay_us: int
    preferred_batch_sizes: tuple[int, ...]
    priority_levels: int
    default_priority_level: int
    default_queue_timeout_us: int  # 0: no limit
    max_queue_size: int  # 0: only the worker's own bounds


@dataclass(frozen=True)
class ModelConfigInfo:
    """One version's configuration (KServe / Triton ModelConfig), from the replicas that serve it."""

    name: str
    version: str
    backend: str
    max_batch_size: int  # 0: the model does not batch
    inputs: tuple[TensorMeta, ...]  # shapes with the batch dimension, as metadata gives them
    outputs: tuple[TensorMeta, ...]
    dynamic_batching: Batching | None
    instance_count: int
    device: str  # "cpu" or "gpu"
    versions: tuple[str, ...]  # the versions serving now (the version policy)
    decoupled: bool = False  # answers a request with any number of responses (streams only)


@dataclass(frozen=True)
class Duration:
    count: int = 0
    ns: int = 0

    def __add__(self, other: Duration) -> Duration:
        return Duration(self.count + other.count, self.ns + other.ns)


@dataclass(frozen=True)
class BatchSizeStats:
    batch_size: int
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()


@dataclass(frozen=True)
class ModelStats:
    """One version's cumulative figures over the workers that hold it (KServe ModelStatistics)."""

    name: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = Duration()
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()
    batches: tuple[BatchSizeStats, ...] = ()


@dataclass(frozen=True)
class RouteDecision:
    model: str
    version: str
    worker_id: str
    data_endpoint: str  # the worker's ZeroMQ endpoint
    breaker_level: int
    header_flags: int  # TensorHeader flags the request must carry (e.g. secondary features off)
    curve_public_key: str = ""  # the worker's CURVE key, for a direct client's link
    features_off: tuple[str, ...] = ()  # with FLAG_SECONDARY_FEATURES_OFF: which features
    zmq_features: tuple[str, ...] = ()  # what the worker's tensor socket takes (e.g. "batch")
    incarnation: str = ""
    idempotent: bool = False  # the version may run twice (a direct client's one resend)
    alternatives: tuple[RouteDecision, ...] = ()  # other workers that could take it (keyless, on request)
    record_certificate: str = ""  # the worker record's proof (mcpcore.record_signing), for a direct client
    record_signature: str = ""
    control_endpoint: str = ""  # the worker's gRPC address (signed with the record)
    record_local_signature: str = ""  # the signed offer of its same-host endpoint (mcpcore.record_signing)


@dataclass(frozen=True)
class InferResult:
    model: str
    version: str
    worker_id: str
    outputs: dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """A request's place in a sequence (Triton's sequence_id, sequence_start, sequence_end)."""

    id: str
    start: bool = False
    end: bool = False


@dataclass(frozen=True)
class ModelIndexEntry:
    name: str
    version: str
    state: str  # Triton's words: "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
    reason: str = ""


class DataPlane(abc.ABC):
    @abc.abstractmethod
    def live(self) -> bool: ...

    @abc.abstractmethod
    def ready(self) -> bool:
        """Serving: the snapshot is synced from etcd at least once."""

    @abc.abstractmethod
    def model_ready(self, model: str, version: str = "") -> bool: ...

    @abc.abstractmethod
    def model_metadata(self, model: str, version: str = "") -> ModelMetadata:
        """The version's metadata (no version: the one a request without one goes to); ``NotFound``
        when the model or that version has no serving replica."""

    @abc.abstractmethod
    def model_config(self, model: str, version: str = "") -> ModelConfigInfo:
        """The version's configuration, chosen and failing as ``model_metadata``."""

    @abc.abstractmethod
    async def model_statistics(self, model: str = "", version: str = "") -> list[ModelStats]:
        """Every serving version of ``model`` (empty: of every model), or only ``version``; ``NotFound``
        as ``model_metadata`` for a model or version asked for by name."""

    @abc.abstractmethod
    def route(
        self, model: str, version: str = "", routing_key: str = "", candidates: int = 1
    ) -> RouteDecision: ...

    @abc.abstractmethod
    async def infer(
        self,
        model: str,
        version: str,
        request_id: str,
        inputs: Mapping[str, np.ndarray],
        *,
        routing_key: str = "",
        priority: int = 0,
        timeout_s: float | None = None,
        outputs: tuple[str, ...] = (),
        parameters: Mapping[str, str] = field(default_factory=dict),  # type: ignore[assignment]
        sequence: SequenceFlags | None = None,
        on_partial: Callable[[InferResult], None] | None = None,
        trace: Trace | None = None,
    ) -> InferResult:
        """Route and run one request; errors are MCPErrors (``NotFound``, ``InvalidArgument``, ...).
        ``outputs`` (empty: all) are checked here: an unknown name is ``InvalidArgument``, and the result
        holds the named ones that were computed (breaker level 2 may leave a secondary one out).
        ``parameters`` reach the worker's backend. A ``sequence``'s requests all go to the worker its
        start went to, or fail ``Aborted`` once that worker is gone. A decoupled model needs
        ``on_partial``: it gets each answer before the last, which is the result (often empty). A
        ``trace`` (sampled by TraceSetting) gets the hops: FORWARD_START and FORWARD_END per worker tried."""

    @abc.abstractmethod
    def index(self) -> list[ModelIndexEntry]: ...

    @abc.abstractmethod
    async def load(self, model: str, version: str = "") -> None:
        """Forwarded to the scheduler (RepositoryModelLoad)."""

    @abc.abstractmethod
    async def unload(self, model: str) -> None:
        """Forwarded to the scheduler (RepositoryModelUnload)."""
