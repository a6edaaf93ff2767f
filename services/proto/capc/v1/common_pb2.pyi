from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Header(_message.Message):
    __slots__ = ("protocol_version", "task", "config_hash", "request_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    task: str
    config_hash: str
    request_id: str
    def __init__(self, protocol_version: _Optional[int] = ..., task: _Optional[str] = ..., config_hash: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class Recipe(_message.Message):
    __slots__ = ("generator", "params_json", "seed", "start", "count", "shape", "batch_hash")
    GENERATOR_FIELD_NUMBER: _ClassVar[int]
    PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BATCH_HASH_FIELD_NUMBER: _ClassVar[int]
    generator: str
    params_json: str
    seed: int
    start: int
    count: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    batch_hash: bytes
    def __init__(self, generator: _Optional[str] = ..., params_json: _Optional[str] = ..., seed: _Optional[int] = ..., start: _Optional[int] = ..., count: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., batch_hash: _Optional[bytes] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class EncryptedBatch(_message.Message):
    __slots__ = ("context_id", "layout", "batch", "ciphertexts", "ciphertext_hash", "settings_json")
    CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXTS_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_HASH_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_JSON_FIELD_NUMBER: _ClassVar[int]
    context_id: str
    layout: str
    batch: int
    ciphertexts: int
    ciphertext_hash: bytes
    settings_json: str
    def __init__(self, context_id: _Optional[str] = ..., layout: _Optional[str] = ..., batch: _Optional[int] = ..., ciphertexts: _Optional[int] = ..., ciphertext_hash: _Optional[bytes] = ..., settings_json: _Optional[str] = ...) -> None: ...

class QueryBatch(_message.Message):
    __slots__ = ("recipe", "tensor", "encrypted")
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTED_FIELD_NUMBER: _ClassVar[int]
    recipe: Recipe
    tensor: Tensor
    encrypted: EncryptedBatch
    def __init__(self, recipe: _Optional[_Union[Recipe, _Mapping]] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ..., encrypted: _Optional[_Union[EncryptedBatch, _Mapping]] = ...) -> None: ...

class Mechanism(_message.Message):
    __slots__ = ("name", "outputs", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    outputs: int
    params: _containers.ScalarMap[str, float]
    def __init__(self, name: _Optional[str] = ..., outputs: _Optional[int] = ..., params: _Optional[_Mapping[str, float]] = ...) -> None: ...
