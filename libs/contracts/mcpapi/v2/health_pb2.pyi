from mcpapi.v2 import model_pb2 as _model_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClusterHealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerHealth(_message.Message):
    __slots__ = ("worker_id", "alive", "heartbeat_age_ms", "last_active_unix_ms", "replicas", "queue_depth", "drained", "stopping")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    alive: bool
    heartbeat_age_ms: int
    last_active_unix_ms: int
    replicas: int
    queue_depth: int
    drained: str
    stopping: bool
    def __init__(self, worker_id: _Optional[str] = ..., alive: _Optional[bool] = ..., heartbeat_age_ms: _Optional[int] = ..., last_active_unix_ms: _Optional[int] = ..., replicas: _Optional[int] = ..., queue_depth: _Optional[int] = ..., drained: _Optional[str] = ..., stopping: _Optional[bool] = ...) -> None: ...

class StateCount(_message.Message):
    __slots__ = ("state", "count")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    state: _model_pb2.ModelState
    count: int
    def __init__(self, state: _Optional[_Union[_model_pb2.ModelState, str]] = ..., count: _Optional[int] = ...) -> None: ...

class ClusterHealthResponse(_message.Message):
    __slots__ = ("workers", "replicas_by_state", "breakers", "as_of_unix_ms")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    BREAKERS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerHealth]
    replicas_by_state: _containers.RepeatedCompositeFieldContainer[StateCount]
    breakers: _containers.RepeatedCompositeFieldContainer[_model_pb2.BreakerState]
    as_of_unix_ms: int
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerHealth, _Mapping]]] = ..., replicas_by_state: _Optional[_Iterable[_Union[StateCount, _Mapping]]] = ..., breakers: _Optional[_Iterable[_Union[_model_pb2.BreakerState, _Mapping]]] = ..., as_of_unix_ms: _Optional[int] = ...) -> None: ...
