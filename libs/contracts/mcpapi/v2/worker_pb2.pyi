from mcpapi.v2 import model_pb2 as _model_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadRequest(_message.Message):
    __slots__ = ("model", "version", "spec", "model_path")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    spec: _model_pb2.ModelSpec
    model_path: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., spec: _Optional[_Union[_model_pb2.ModelSpec, _Mapping]] = ..., model_path: _Optional[str] = ...) -> None: ...

class LoadResponse(_message.Message):
    __slots__ = ("replica", "memory_bytes", "inputs", "outputs")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    replica: _model_pb2.ReplicaStatus
    memory_bytes: int
    inputs: _containers.RepeatedCompositeFieldContainer[_model_pb2.TensorMetadata]
    outputs: _containers.RepeatedCompositeFieldContainer[_model_pb2.TensorMetadata]
    def __init__(self, replica: _Optional[_Union[_model_pb2.ReplicaStatus, _Mapping]] = ..., memory_bytes: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[_model_pb2.TensorMetadata, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[_model_pb2.TensorMetadata, _Mapping]]] = ...) -> None: ...

class UnloadRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class UnloadResponse(_message.Message):
    __slots__ = ("replica",)
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    replica: _model_pb2.ReplicaStatus
    def __init__(self, replica: _Optional[_Union[_model_pb2.ReplicaStatus, _Mapping]] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("replica", "queued")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    replica: _model_pb2.ReplicaStatus
    queued: int
    def __init__(self, replica: _Optional[_Union[_model_pb2.ReplicaStatus, _Mapping]] = ..., queued: _Optional[int] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("replica",)
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    replica: _model_pb2.ReplicaStatus
    def __init__(self, replica: _Optional[_Union[_model_pb2.ReplicaStatus, _Mapping]] = ...) -> None: ...

class EmergencyStopRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class EmergencyStopResponse(_message.Message):
    __slots__ = ("checkpoint_path", "in_flight", "last_active_unix_ms", "replicas")
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    checkpoint_path: str
    in_flight: int
    last_active_unix_ms: int
    replicas: _containers.RepeatedCompositeFieldContainer[_model_pb2.ReplicaStatus]
    def __init__(self, checkpoint_path: _Optional[str] = ..., in_flight: _Optional[int] = ..., last_active_unix_ms: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[_model_pb2.ReplicaStatus, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ModelVersionStats(_message.Message):
    __slots__ = ("model", "version", "state", "queue_depth", "batch_utilization", "memory_bytes", "mean_exec_us", "in_flight", "max_batch_size", "requests_total", "totals")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    BATCH_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEAN_EXEC_US_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    state: _model_pb2.ModelState
    queue_depth: int
    batch_utilization: float
    memory_bytes: int
    mean_exec_us: int
    in_flight: int
    max_batch_size: int
    requests_total: int
    totals: ReplicaTotals
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., state: _Optional[_Union[_model_pb2.ModelState, str]] = ..., queue_depth: _Optional[int] = ..., batch_utilization: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., mean_exec_us: _Optional[int] = ..., in_flight: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., requests_total: _Optional[int] = ..., totals: _Optional[_Union[ReplicaTotals, _Mapping]] = ...) -> None: ...

class Duration(_message.Message):
    __slots__ = ("count", "ns")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    NS_FIELD_NUMBER: _ClassVar[int]
    count: int
    ns: int
    def __init__(self, count: _Optional[int] = ..., ns: _Optional[int] = ...) -> None: ...

class BatchSizeTotals(_message.Message):
    __slots__ = ("batch_size", "compute_input", "compute_infer", "compute_output")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INPUT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INFER_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    def __init__(self, batch_size: _Optional[int] = ..., compute_input: _Optional[_Union[Duration, _Mapping]] = ..., compute_infer: _Optional[_Union[Duration, _Mapping]] = ..., compute_output: _Optional[_Union[Duration, _Mapping]] = ...) -> None: ...

class ReplicaTotals(_message.Message):
    __slots__ = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "inference_count", "execution_count", "last_inference_ms", "batches")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    FAIL_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INPUT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_INFER_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    inference_count: int
    execution_count: int
    last_inference_ms: int
    batches: _containers.RepeatedCompositeFieldContainer[BatchSizeTotals]
    def __init__(self, success: _Optional[_Union[Duration, _Mapping]] = ..., fail: _Optional[_Union[Duration, _Mapping]] = ..., queue: _Optional[_Union[Duration, _Mapping]] = ..., compute_input: _Optional[_Union[Duration, _Mapping]] = ..., compute_infer: _Optional[_Union[Duration, _Mapping]] = ..., compute_output: _Optional[_Union[Duration, _Mapping]] = ..., inference_count: _Optional[int] = ..., execution_count: _Optional[int] = ..., last_inference_ms: _Optional[int] = ..., batches: _Optional[_Iterable[_Union[BatchSizeTotals, _Mapping]]] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("worker_id", "models", "memory_capacity_bytes", "memory_used_bytes", "as_of_unix_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    AS_OF_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    models: _containers.RepeatedCompositeFieldContainer[ModelVersionStats]
    memory_capacity_bytes: int
    memory_used_bytes: int
    as_of_unix_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelVersionStats, _Mapping]]] = ..., memory_capacity_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., as_of_unix_ms: _Optional[int] = ...) -> None: ...
