from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteRequest(_message.Message):
    __slots__ = ("model", "version", "routing_key")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    routing_key: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., routing_key: _Optional[str] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("worker_id", "data_endpoint", "version", "breaker_level")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BREAKER_LEVEL_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    data_endpoint: str
    version: str
    breaker_level: int
    def __init__(self, worker_id: _Optional[str] = ..., data_endpoint: _Optional[str] = ..., version: _Optional[str] = ..., breaker_level: _Optional[int] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class InferRequest(_message.Message):
    __slots__ = ("model", "version", "request_id", "routing_key", "inputs")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    request_id: str
    routing_key: str
    inputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., request_id: _Optional[str] = ..., routing_key: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class InferResponse(_message.Message):
    __slots__ = ("model", "version", "request_id", "outputs")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    request_id: str
    outputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., request_id: _Optional[str] = ..., outputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...
