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
    __slots__ = ("model", "version", "worker_id", "state", "since_unix_ms", "reason")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    worker_id: str
    state: ModelState
    since_unix_ms: int
    reason: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., worker_id: _Optional[str] = ..., state: _Optional[_Union[ModelState, str]] = ..., since_unix_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("model", "state", "replicas")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    model: str
    state: ModelState
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    def __init__(self, model: _Optional[str] = ..., state: _Optional[_Union[ModelState, str]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("model", "version", "replicas")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    replicas: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., replicas: _Optional[int] = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: ModelStatus
    def __init__(self, status: _Optional[_Union[ModelStatus, _Mapping]] = ...) -> None: ...

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
    status: ModelStatus
    def __init__(self, status: _Optional[_Union[ModelStatus, _Mapping]] = ...) -> None: ...

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
    status: ModelStatus
    def __init__(self, status: _Optional[_Union[ModelStatus, _Mapping]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ...) -> None: ...
