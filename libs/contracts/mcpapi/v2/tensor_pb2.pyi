from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TYPE_INVALID: _ClassVar[DataType]
    TYPE_BOOL: _ClassVar[DataType]
    TYPE_UINT8: _ClassVar[DataType]
    TYPE_UINT16: _ClassVar[DataType]
    TYPE_UINT32: _ClassVar[DataType]
    TYPE_UINT64: _ClassVar[DataType]
    TYPE_INT8: _ClassVar[DataType]
    TYPE_INT16: _ClassVar[DataType]
    TYPE_INT32: _ClassVar[DataType]
    TYPE_INT64: _ClassVar[DataType]
    TYPE_FP16: _ClassVar[DataType]
    TYPE_FP32: _ClassVar[DataType]
    TYPE_FP64: _ClassVar[DataType]
    TYPE_BYTES: _ClassVar[DataType]
    TYPE_BF16: _ClassVar[DataType]

class HeaderFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FLAG_NONE: _ClassVar[HeaderFlag]
    FLAG_SECONDARY_FEATURES_OFF: _ClassVar[HeaderFlag]
    FLAG_RETRYABLE: _ClassVar[HeaderFlag]
    FLAG_DRAINING: _ClassVar[HeaderFlag]
    FLAG_PARTIAL: _ClassVar[HeaderFlag]
    FLAG_TAKES_COALESCED: _ClassVar[HeaderFlag]
    FLAG_DIRECT: _ClassVar[HeaderFlag]
    FLAG_SHARED_MEMORY: _ClassVar[HeaderFlag]

class MessageKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KIND_UNSPECIFIED: _ClassVar[MessageKind]
    KIND_REQUEST: _ClassVar[MessageKind]
    KIND_REPLY: _ClassVar[MessageKind]
    KIND_CANCEL: _ClassVar[MessageKind]
    KIND_BATCH: _ClassVar[MessageKind]
TYPE_INVALID: DataType
TYPE_BOOL: DataType
TYPE_UINT8: DataType
TYPE_UINT16: DataType
TYPE_UINT32: DataType
TYPE_UINT64: DataType
TYPE_INT8: DataType
TYPE_INT16: DataType
TYPE_INT32: DataType
TYPE_INT64: DataType
TYPE_FP16: DataType
TYPE_FP32: DataType
TYPE_FP64: DataType
TYPE_BYTES: DataType
TYPE_BF16: DataType
FLAG_NONE: HeaderFlag
FLAG_SECONDARY_FEATURES_OFF: HeaderFlag
FLAG_RETRYABLE: HeaderFlag
FLAG_DRAINING: HeaderFlag
FLAG_PARTIAL: HeaderFlag
FLAG_TAKES_COALESCED: HeaderFlag
FLAG_DIRECT: HeaderFlag
FLAG_SHARED_MEMORY: HeaderFlag
KIND_UNSPECIFIED: MessageKind
KIND_REQUEST: MessageKind
KIND_REPLY: MessageKind
KIND_CANCEL: MessageKind
KIND_BATCH: MessageKind

class SharedRegion(_message.Message):
    __slots__ = ("fd", "offset", "size")
    FD_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    fd: int
    offset: int
    size: int
    def __init__(self, fd: _Optional[int] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "byte_size", "shm")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BYTE_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DataType
    shape: _containers.RepeatedScalarFieldContainer[int]
    byte_size: int
    shm: SharedRegion
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DataType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., byte_size: _Optional[int] = ..., shm: _Optional[_Union[SharedRegion, _Mapping]] = ...) -> None: ...

class TensorHeader(_message.Message):
    __slots__ = ("kind", "request_id", "model", "version", "tensors", "timeout_us", "priority", "flags", "status_code", "status_message", "parameters", "batch", "reply_region")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_US_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    REPLY_REGION_FIELD_NUMBER: _ClassVar[int]
    kind: MessageKind
    request_id: str
    model: str
    version: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    timeout_us: int
    priority: int
    flags: int
    status_code: int
    status_message: str
    parameters: _containers.ScalarMap[str, str]
    batch: _containers.RepeatedCompositeFieldContainer[TensorHeader]
    reply_region: SharedRegion
    def __init__(self, kind: _Optional[_Union[MessageKind, str]] = ..., request_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., timeout_us: _Optional[int] = ..., priority: _Optional[int] = ..., flags: _Optional[int] = ..., status_code: _Optional[int] = ..., status_message: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., batch: _Optional[_Iterable[_Union[TensorHeader, _Mapping]]] = ..., reply_region: _Optional[_Union[SharedRegion, _Mapping]] = ...) -> None: ...
