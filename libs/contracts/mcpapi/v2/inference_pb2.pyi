from mcpapi.v2 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RouteRequest(_message.Message):
    __slots__ = ("model", "version", "routing_key", "priority", "candidates")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    routing_key: str
    priority: int
    candidates: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., routing_key: _Optional[str] = ..., priority: _Optional[int] = ..., candidates: _Optional[int] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("worker_id", "data_endpoint", "version", "breaker_level", "header_flags", "curve_public_key", "features_off", "zmq_features", "incarnation", "idempotent", "alternatives", "record_certificate", "record_signature", "control_endpoint", "record_local_signature")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BREAKER_LEVEL_FIELD_NUMBER: _ClassVar[int]
    HEADER_FLAGS_FIELD_NUMBER: _ClassVar[int]
    CURVE_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    FEATURES_OFF_FIELD_NUMBER: _ClassVar[int]
    ZMQ_FEATURES_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    RECORD_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    RECORD_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CONTROL_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    RECORD_LOCAL_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    data_endpoint: str
    version: str
    breaker_level: int
    header_flags: int
    curve_public_key: str
    features_off: _containers.RepeatedScalarFieldContainer[str]
    zmq_features: _containers.RepeatedScalarFieldContainer[str]
    incarnation: str
    idempotent: bool
    alternatives: _containers.RepeatedCompositeFieldContainer[RouteResponse]
    record_certificate: str
    record_signature: str
    control_endpoint: str
    record_local_signature: str
    def __init__(self, worker_id: _Optional[str] = ..., data_endpoint: _Optional[str] = ..., version: _Optional[str] = ..., breaker_level: _Optional[int] = ..., header_flags: _Optional[int] = ..., curve_public_key: _Optional[str] = ..., features_off: _Optional[_Iterable[str]] = ..., zmq_features: _Optional[_Iterable[str]] = ..., incarnation: _Optional[str] = ..., idempotent: _Optional[bool] = ..., alternatives: _Optional[_Iterable[_Union[RouteResponse, _Mapping]]] = ..., record_certificate: _Optional[str] = ..., record_signature: _Optional[str] = ..., control_endpoint: _Optional[str] = ..., record_local_signature: _Optional[str] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("name", "shape", "data", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    dtype: _tensor_pb2.DataType
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., dtype: _Optional[_Union[_tensor_pb2.DataType, str]] = ...) -> None: ...

class InferRequest(_message.Message):
    __slots__ = ("model", "version", "request_id", "routing_key", "inputs", "priority", "timeout_us", "parameters", "outputs")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_US_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    request_id: str
    routing_key: str
    inputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    priority: int
    timeout_us: int
    parameters: _containers.ScalarMap[str, str]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., request_id: _Optional[str] = ..., routing_key: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., priority: _Optional[int] = ..., timeout_us: _Optional[int] = ..., parameters: _Optional[_Mapping[str, str]] = ..., outputs: _Optional[_Iterable[str]] = ...) -> None: ...

class InferResponse(_message.Message):
    __slots__ = ("model", "version", "request_id", "outputs", "worker_id", "parameters")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    request_id: str
    outputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    worker_id: str
    parameters: _containers.ScalarMap[str, str]
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., request_id: _Optional[str] = ..., outputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., worker_id: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ...) -> None: ...
