from mcpapi.v2 import model_pb2 as _model_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_REPLICA: _ClassVar[EventKind]
    EVENT_KIND_REPLICA_REMOVED: _ClassVar[EventKind]
    EVENT_KIND_SPEC: _ClassVar[EventKind]
    EVENT_KIND_MODEL_REMOVED: _ClassVar[EventKind]
    EVENT_KIND_TRAFFIC: _ClassVar[EventKind]
    EVENT_KIND_BREAKER: _ClassVar[EventKind]
    EVENT_KIND_SYNCED: _ClassVar[EventKind]
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_REPLICA: EventKind
EVENT_KIND_REPLICA_REMOVED: EventKind
EVENT_KIND_SPEC: EventKind
EVENT_KIND_MODEL_REMOVED: EventKind
EVENT_KIND_TRAFFIC: EventKind
EVENT_KIND_BREAKER: EventKind
EVENT_KIND_SYNCED: EventKind

class LoadModelRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _model_pb2.ModelSpec
    def __init__(self, spec: _Optional[_Union[_model_pb2.ModelSpec, _Mapping]] = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _model_pb2.ModelStatus
    def __init__(self, status: _Optional[_Union[_model_pb2.ModelStatus, _Mapping]] = ...) -> None: ...

class UnloadModelRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class UnloadModelResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _model_pb2.ModelStatus
    def __init__(self, status: _Optional[_Union[_model_pb2.ModelStatus, _Mapping]] = ...) -> None: ...

class GetModelStatusRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class GetModelStatusResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _model_pb2.ModelStatus
    def __init__(self, status: _Optional[_Union[_model_pb2.ModelStatus, _Mapping]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ("prefix",)
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    def __init__(self, prefix: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[_model_pb2.ModelStatus]
    def __init__(self, models: _Optional[_Iterable[_Union[_model_pb2.ModelStatus, _Mapping]]] = ...) -> None: ...

class WatchModelsRequest(_message.Message):
    __slots__ = ("models", "initial_snapshot")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedScalarFieldContainer[str]
    initial_snapshot: bool
    def __init__(self, models: _Optional[_Iterable[str]] = ..., initial_snapshot: _Optional[bool] = ...) -> None: ...

class ModelEvent(_message.Message):
    __slots__ = ("kind", "model", "revision", "replica", "spec", "traffic", "breaker", "previous_state")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_STATE_FIELD_NUMBER: _ClassVar[int]
    kind: EventKind
    model: str
    revision: int
    replica: _model_pb2.ReplicaStatus
    spec: _model_pb2.ModelSpec
    traffic: _model_pb2.TrafficSplit
    breaker: _model_pb2.BreakerState
    previous_state: _model_pb2.ModelState
    def __init__(self, kind: _Optional[_Union[EventKind, str]] = ..., model: _Optional[str] = ..., revision: _Optional[int] = ..., replica: _Optional[_Union[_model_pb2.ReplicaStatus, _Mapping]] = ..., spec: _Optional[_Union[_model_pb2.ModelSpec, _Mapping]] = ..., traffic: _Optional[_Union[_model_pb2.TrafficSplit, _Mapping]] = ..., breaker: _Optional[_Union[_model_pb2.BreakerState, _Mapping]] = ..., previous_state: _Optional[_Union[_model_pb2.ModelState, str]] = ...) -> None: ...

class SetTrafficRequest(_message.Message):
    __slots__ = ("model", "traffic")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    model: str
    traffic: _model_pb2.TrafficSplit
    def __init__(self, model: _Optional[str] = ..., traffic: _Optional[_Union[_model_pb2.TrafficSplit, _Mapping]] = ...) -> None: ...

class SetTrafficResponse(_message.Message):
    __slots__ = ("traffic", "pending")
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    traffic: _model_pb2.TrafficSplit
    pending: str
    def __init__(self, traffic: _Optional[_Union[_model_pb2.TrafficSplit, _Mapping]] = ..., pending: _Optional[str] = ...) -> None: ...

class PauseModelRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class PauseModelResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _model_pb2.ModelStatus
    def __init__(self, status: _Optional[_Union[_model_pb2.ModelStatus, _Mapping]] = ...) -> None: ...

class ResumeModelRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class ResumeModelResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _model_pb2.ModelStatus
    def __init__(self, status: _Optional[_Union[_model_pb2.ModelStatus, _Mapping]] = ...) -> None: ...

class GetBreakerRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class GetBreakerResponse(_message.Message):
    __slots__ = ("breaker",)
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    breaker: _model_pb2.BreakerState
    def __init__(self, breaker: _Optional[_Union[_model_pb2.BreakerState, _Mapping]] = ...) -> None: ...

class SetBreakerRequest(_message.Message):
    __slots__ = ("model", "level", "reason", "until_unix_ms", "set_by", "clear")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SET_BY_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    model: str
    level: int
    reason: str
    until_unix_ms: int
    set_by: str
    clear: bool
    def __init__(self, model: _Optional[str] = ..., level: _Optional[int] = ..., reason: _Optional[str] = ..., until_unix_ms: _Optional[int] = ..., set_by: _Optional[str] = ..., clear: _Optional[bool] = ...) -> None: ...

class SetBreakerResponse(_message.Message):
    __slots__ = ("breaker",)
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    breaker: _model_pb2.BreakerState
    def __init__(self, breaker: _Optional[_Union[_model_pb2.BreakerState, _Mapping]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("worker_id", "reason")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    reason: str
    def __init__(self, worker_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[_model_pb2.ReplicaStatus]
    def __init__(self, replicas: _Optional[_Iterable[_Union[_model_pb2.ReplicaStatus, _Mapping]]] = ...) -> None: ...

class UndrainRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class UndrainResponse(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...
