from services.proto.capc.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetLoopRequest(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ...) -> None: ...

class LoopReport(_message.Message):
    __slots__ = ("hospital", "querier", "before", "after", "labels_bought", "records_revealed", "jobs")
    HOSPITAL_FIELD_NUMBER: _ClassVar[int]
    QUERIER_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LABELS_BOUGHT_FIELD_NUMBER: _ClassVar[int]
    RECORDS_REVEALED_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    hospital: str
    querier: str
    before: StudentModel
    after: StudentModel
    labels_bought: int
    records_revealed: int
    jobs: int
    def __init__(self, hospital: _Optional[str] = ..., querier: _Optional[str] = ..., before: _Optional[_Union[StudentModel, _Mapping]] = ..., after: _Optional[_Union[StudentModel, _Mapping]] = ..., labels_bought: _Optional[int] = ..., records_revealed: _Optional[int] = ..., jobs: _Optional[int] = ...) -> None: ...

class CreateJobRequest(_message.Message):
    __slots__ = ("header", "queries", "count", "batch_size", "mechanism_overrides", "reveal_records_to_answerers", "revealed_by")
    class MechanismOverridesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    HEADER_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    REVEAL_RECORDS_TO_ANSWERERS_FIELD_NUMBER: _ClassVar[int]
    REVEALED_BY_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    queries: _common_pb2.QueryBatch
    count: int
    batch_size: int
    mechanism_overrides: _containers.ScalarMap[str, float]
    reveal_records_to_answerers: bool
    revealed_by: str
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., queries: _Optional[_Union[_common_pb2.QueryBatch, _Mapping]] = ..., count: _Optional[int] = ..., batch_size: _Optional[int] = ..., mechanism_overrides: _Optional[_Mapping[str, float]] = ..., reveal_records_to_answerers: _Optional[bool] = ..., revealed_by: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "state", "requested", "processed", "answered", "rounds", "error", "task", "source", "created_at", "mechanism", "round_seconds", "records_revealed")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    ROUND_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_REVEALED_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    requested: int
    processed: int
    answered: int
    rounds: int
    error: str
    task: str
    source: str
    created_at: str
    mechanism: _common_pb2.Mechanism
    round_seconds: float
    records_revealed: bool
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., requested: _Optional[int] = ..., processed: _Optional[int] = ..., answered: _Optional[int] = ..., rounds: _Optional[int] = ..., error: _Optional[str] = ..., task: _Optional[str] = ..., source: _Optional[str] = ..., created_at: _Optional[str] = ..., mechanism: _Optional[_Union[_common_pb2.Mechanism, _Mapping]] = ..., round_seconds: _Optional[float] = ..., records_revealed: _Optional[bool] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("header", "id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    id: str
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., id: _Optional[str] = ...) -> None: ...

class GetResultsRequest(_message.Message):
    __slots__ = ("header", "id", "offset", "limit")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    id: str
    offset: int
    limit: int
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., id: _Optional[str] = ..., offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class JobResults(_message.Message):
    __slots__ = ("job", "labels", "queries", "total")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    job: Job
    labels: _common_pb2.Tensor
    queries: _common_pb2.Tensor
    total: int
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., labels: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., queries: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., total: _Optional[int] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("header", "limit", "offset")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    limit: int
    offset: int
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., limit: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class TrainModelRequest(_message.Message):
    __slots__ = ("header", "job_ids", "architecture", "epochs", "seed", "l2", "semi_supervised", "own_weight")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    L2_FIELD_NUMBER: _ClassVar[int]
    SEMI_SUPERVISED_FIELD_NUMBER: _ClassVar[int]
    OWN_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    architecture: str
    epochs: int
    seed: int
    l2: float
    semi_supervised: str
    own_weight: int
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., job_ids: _Optional[_Iterable[str]] = ..., architecture: _Optional[str] = ..., epochs: _Optional[int] = ..., seed: _Optional[int] = ..., l2: _Optional[float] = ..., semi_supervised: _Optional[str] = ..., own_weight: _Optional[int] = ...) -> None: ...

class StudentModel(_message.Message):
    __slots__ = ("id", "state", "job_ids", "architecture", "epochs", "examples", "metrics_json", "error", "created_at", "options_json", "progress_done", "progress_total", "progress_unit")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_DONE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_UNIT_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    architecture: str
    epochs: int
    examples: int
    metrics_json: str
    error: str
    created_at: str
    options_json: str
    progress_done: int
    progress_total: int
    progress_unit: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., job_ids: _Optional[_Iterable[str]] = ..., architecture: _Optional[str] = ..., epochs: _Optional[int] = ..., examples: _Optional[int] = ..., metrics_json: _Optional[str] = ..., error: _Optional[str] = ..., created_at: _Optional[str] = ..., options_json: _Optional[str] = ..., progress_done: _Optional[int] = ..., progress_total: _Optional[int] = ..., progress_unit: _Optional[str] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("header", "id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    id: str
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., id: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ...) -> None: ...

class ListModelsReply(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[StudentModel]
    def __init__(self, models: _Optional[_Iterable[_Union[StudentModel, _Mapping]]] = ...) -> None: ...

class ModelFile(_message.Message):
    __slots__ = ("model", "checkpoint", "card_json")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CARD_JSON_FIELD_NUMBER: _ClassVar[int]
    model: StudentModel
    checkpoint: bytes
    card_json: str
    def __init__(self, model: _Optional[_Union[StudentModel, _Mapping]] = ..., checkpoint: _Optional[bytes] = ..., card_json: _Optional[str] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("header", "id", "records")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    id: str
    records: _common_pb2.Tensor
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., id: _Optional[str] = ..., records: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class PredictReply(_message.Message):
    __slots__ = ("id", "labels", "scores")
    ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    id: str
    labels: _common_pb2.Tensor
    scores: _common_pb2.Tensor
    def __init__(self, id: _Optional[str] = ..., labels: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., scores: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...
