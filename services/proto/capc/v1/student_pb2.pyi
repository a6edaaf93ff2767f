from services.proto.capc.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateJobRequest(_message.Message):
    __slots__ = ("header", "queries", "count", "batch_size", "mechanism")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    queries: _common_pb2.QueryBatch
    count: int
    batch_size: int
    mechanism: _common_pb2.Mechanism
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., queries: _Optional[_Union[_common_pb2.QueryBatch, _Mapping]] = ..., count: _Optional[int] = ..., batch_size: _Optional[int] = ..., mechanism: _Optional[_Union[_common_pb2.Mechanism, _Mapping]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "state", "requested", "processed", "answered", "rounds", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    requested: int
    processed: int
    answered: int
    rounds: int
    error: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., requested: _Optional[int] = ..., processed: _Optional[int] = ..., answered: _Optional[int] = ..., rounds: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("header", "id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    id: str
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., id: _Optional[str] = ...) -> None: ...

class GetResultsRequest(_message.Message):
    __slots__ = ("header", "id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    id: str
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., id: _Optional[str] = ...) -> None: ...

class JobResults(_message.Message):
    __slots__ = ("job", "labels", "queries")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    job: Job
    labels: _common_pb2.Tensor
    queries: _common_pb2.Tensor
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., labels: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., queries: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...
