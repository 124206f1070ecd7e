from mcpapi.v2 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_UNSPECIFIED: _ClassVar[ModelState]
    IDLE: _ClassVar[ModelState]
    LOADING: _ClassVar[ModelState]
    READY: _ClassVar[ModelState]
    RUNNING: _ClassVar[ModelState]
    PAUSED: _ClassVar[ModelState]
    UNLOADING: _ClassVar[ModelState]
    ERROR: _ClassVar[ModelState]
    RECOVERING: _ClassVar[ModelState]
STATE_UNSPECIFIED: ModelState
IDLE: ModelState
LOADING: ModelState
READY: ModelState
RUNNING: ModelState
PAUSED: ModelState
UNLOADING: ModelState
ERROR: ModelState
RECOVERING: ModelState

class ReplicaStatus(_message.Message):
    __slots__ = ("model", "version", "worker_id", "state", "since_unix_ms", "reason", "revision")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    worker_id: str
    state: ModelState
    since_unix_ms: int
    reason: str
    revision: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., worker_id: _Optional[str] = ..., state: _Optional[_Union[ModelState, str]] = ..., since_unix_ms: _Optional[int] = ..., reason: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class PlacementConstraints(_message.Message):
    __slots__ = ("memory_bytes", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    labels: _containers.ScalarMap[str, str]
    def __init__(self, memory_bytes: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class QoS(_message.Message):
    __slots__ = ("latency_sensitivity", "secondary_features")
    LATENCY_SENSITIVITY_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_FEATURES_FIELD_NUMBER: _ClassVar[int]
    latency_sensitivity: float
    secondary_features: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, latency_sensitivity: _Optional[float] = ..., secondary_features: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchingPolicy(_message.Message):
    __slots__ = ("max_batch_size", "max_queue_delay_us", "preferred_batch_sizes", "priority_levels", "default_queue_timeout_us", "max_queue_size")
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_US_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_LEVELS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_QUEUE_TIMEOUT_US_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    max_batch_size: int
    max_queue_delay_us: int
    preferred_batch_sizes: _containers.RepeatedScalarFieldContainer[int]
    priority_levels: int
    default_queue_timeout_us: int
    max_queue_size: int
    def __init__(self, max_batch_size: _Optional[int] = ..., max_queue_delay_us: _Optional[int] = ..., preferred_batch_sizes: _Optional[_Iterable[int]] = ..., priority_levels: _Optional[int] = ..., default_queue_timeout_us: _Optional[int] = ..., max_queue_size: _Optional[int] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("model", "versions", "replicas", "min_replicas", "max_replicas", "placement", "priority", "qos", "batching", "fallback_version", "load_on_demand")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOAD_ON_DEMAND_FIELD_NUMBER: _ClassVar[int]
    model: str
    versions: _containers.RepeatedScalarFieldContainer[str]
    replicas: int
    min_replicas: int
    max_replicas: int
    placement: PlacementConstraints
    priority: int
    qos: QoS
    batching: BatchingPolicy
    fallback_version: str
    load_on_demand: bool
    def __init__(self, model: _Optional[str] = ..., versions: _Optional[_Iterable[str]] = ..., replicas: _Optional[int] = ..., min_replicas: _Optional[int] = ..., max_replicas: _Optional[int] = ..., placement: _Optional[_Union[PlacementConstraints, _Mapping]] = ..., priority: _Optional[int] = ..., qos: _Optional[_Union[QoS, _Mapping]] = ..., batching: _Optional[_Union[BatchingPolicy, _Mapping]] = ..., fallback_version: _Optional[str] = ..., load_on_demand: _Optional[bool] = ...) -> None: ...

class TensorMetadata(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: _tensor_pb2.DataType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[_tensor_pb2.DataType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class TrafficSplit(_message.Message):
    __slots__ = ("stable", "canary", "canary_percent")
    STABLE_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    CANARY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    stable: str
    canary: str
    canary_percent: int
    def __init__(self, stable: _Optional[str] = ..., canary: _Optional[str] = ..., canary_percent: _Optional[int] = ...) -> None: ...

class BreakerState(_message.Message):
    __slots__ = ("model", "level", "reason", "since_unix_ms", "set_by", "until_unix_ms")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SET_BY_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    model: str
    level: int
    reason: str
    since_unix_ms: int
    set_by: str
    until_unix_ms: int
    def __init__(self, model: _Optional[str] = ..., level: _Optional[int] = ..., reason: _Optional[str] = ..., since_unix_ms: _Optional[int] = ..., set_by: _Optional[str] = ..., until_unix_ms: _Optional[int] = ...) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("model", "state", "replicas", "spec", "traffic", "breaker", "pending")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    model: str
    state: ModelState
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    spec: ModelSpec
    traffic: TrafficSplit
    breaker: BreakerState
    pending: str
    def __init__(self, model: _Optional[str] = ..., state: _Optional[_Union[ModelState, str]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., spec: _Optional[_Union[ModelSpec, _Mapping]] = ..., traffic: _Optional[_Union[TrafficSplit, _Mapping]] = ..., breaker: _Optional[_Union[BreakerState, _Mapping]] = ..., pending: _Optional[str] = ...) -> None: ...
