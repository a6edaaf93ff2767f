from services.proto.capc.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Settlement(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SETTLEMENT_UNSPECIFIED: _ClassVar[Settlement]
    SETTLEMENT_CHARGED: _ClassVar[Settlement]
    SETTLEMENT_WORST_CASE: _ClassVar[Settlement]
    SETTLEMENT_NOT_CHARGED: _ClassVar[Settlement]
SETTLEMENT_UNSPECIFIED: Settlement
SETTLEMENT_CHARGED: Settlement
SETTLEMENT_WORST_CASE: Settlement
SETTLEMENT_NOT_CHARGED: Settlement

class PartyMessage(_message.Message):
    __slots__ = ("header", "register", "shares", "heartbeat", "failure", "relay", "report")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    register: Register
    shares: Shares
    heartbeat: Heartbeat
    failure: RoundFailure
    relay: RelayFrame
    report: SpendReport
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., register: _Optional[_Union[Register, _Mapping]] = ..., shares: _Optional[_Union[Shares, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., failure: _Optional[_Union[RoundFailure, _Mapping]] = ..., relay: _Optional[_Union[RelayFrame, _Mapping]] = ..., report: _Optional[_Union[SpendReport, _Mapping]] = ...) -> None: ...

class RelayFrame(_message.Message):
    __slots__ = ("header", "round_id", "party", "payload", "hello")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    round_id: int
    party: str
    payload: bytes
    hello: bool
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., round_id: _Optional[int] = ..., party: _Optional[str] = ..., payload: _Optional[bytes] = ..., hello: _Optional[bool] = ...) -> None: ...

class TeacherInfo(_message.Message):
    __slots__ = ("architecture", "input_shape", "num_classes", "model_hash")
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    MODEL_HASH_FIELD_NUMBER: _ClassVar[int]
    architecture: str
    input_shape: _containers.RepeatedScalarFieldContainer[int]
    num_classes: int
    model_hash: str
    def __init__(self, architecture: _Optional[str] = ..., input_shape: _Optional[_Iterable[int]] = ..., num_classes: _Optional[int] = ..., model_hash: _Optional[str] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("teachers", "epsilon_cap", "accounting_json", "open_rounds", "cap_reason", "dp_training")
    TEACHERS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_CAP_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_JSON_FIELD_NUMBER: _ClassVar[int]
    OPEN_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    CAP_REASON_FIELD_NUMBER: _ClassVar[int]
    DP_TRAINING_FIELD_NUMBER: _ClassVar[int]
    teachers: _containers.RepeatedCompositeFieldContainer[TeacherInfo]
    epsilon_cap: float
    accounting_json: str
    open_rounds: _containers.RepeatedScalarFieldContainer[int]
    cap_reason: str
    dp_training: DpAttestation
    def __init__(self, teachers: _Optional[_Iterable[_Union[TeacherInfo, _Mapping]]] = ..., epsilon_cap: _Optional[float] = ..., accounting_json: _Optional[str] = ..., open_rounds: _Optional[_Iterable[int]] = ..., cap_reason: _Optional[str] = ..., dp_training: _Optional[_Union[DpAttestation, _Mapping]] = ...) -> None: ...

class DpAttestation(_message.Message):
    __slots__ = ("records_json", "sha256")
    RECORDS_JSON_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    records_json: _containers.RepeatedScalarFieldContainer[str]
    sha256: str
    def __init__(self, records_json: _Optional[_Iterable[str]] = ..., sha256: _Optional[str] = ...) -> None: ...

class Shares(_message.Message):
    __slots__ = ("round_id", "shape", "guardian_share", "sealed_seed", "batch_hash", "proof")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    GUARDIAN_SHARE_FIELD_NUMBER: _ClassVar[int]
    SEALED_SEED_FIELD_NUMBER: _ClassVar[int]
    BATCH_HASH_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    guardian_share: bytes
    sealed_seed: bytes
    batch_hash: bytes
    proof: ProofShare
    def __init__(self, round_id: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., guardian_share: _Optional[bytes] = ..., sealed_seed: _Optional[bytes] = ..., batch_hash: _Optional[bytes] = ..., proof: _Optional[_Union[ProofShare, _Mapping]] = ...) -> None: ...

class ProofShare(_message.Message):
    __slots__ = ("shape", "share")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    share: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., share: _Optional[bytes] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sent_unix_ms", "open_rounds")
    SENT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    OPEN_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    sent_unix_ms: int
    open_rounds: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sent_unix_ms: _Optional[int] = ..., open_rounds: _Optional[_Iterable[int]] = ...) -> None: ...

class RoundFailure(_message.Message):
    __slots__ = ("round_id", "reason", "budget_refused")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BUDGET_REFUSED_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    reason: str
    budget_refused: bool
    def __init__(self, round_id: _Optional[int] = ..., reason: _Optional[str] = ..., budget_refused: _Optional[bool] = ...) -> None: ...

class SpendReport(_message.Message):
    __slots__ = ("through_round", "settled_loss", "epsilon_spent", "epsilon_cap", "open_rounds", "accounting_json")
    THROUGH_ROUND_FIELD_NUMBER: _ClassVar[int]
    SETTLED_LOSS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_CAP_FIELD_NUMBER: _ClassVar[int]
    OPEN_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_JSON_FIELD_NUMBER: _ClassVar[int]
    through_round: int
    settled_loss: _containers.RepeatedScalarFieldContainer[float]
    epsilon_spent: float
    epsilon_cap: float
    open_rounds: int
    accounting_json: str
    def __init__(self, through_round: _Optional[int] = ..., settled_loss: _Optional[_Iterable[float]] = ..., epsilon_spent: _Optional[float] = ..., epsilon_cap: _Optional[float] = ..., open_rounds: _Optional[int] = ..., accounting_json: _Optional[str] = ...) -> None: ...

class AuditHead(_message.Message):
    __slots__ = ("seq", "hash", "signature")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    hash: str
    signature: str
    def __init__(self, seq: _Optional[int] = ..., hash: _Optional[str] = ..., signature: _Optional[str] = ...) -> None: ...

class HubMessage(_message.Message):
    __slots__ = ("header", "registered", "work", "cancelled", "relay", "settled", "task")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    registered: Registered
    work: RoundWork
    cancelled: RoundCancelled
    relay: RelayFrame
    settled: RoundSettled
    task: TaskDefinition
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., registered: _Optional[_Union[Registered, _Mapping]] = ..., work: _Optional[_Union[RoundWork, _Mapping]] = ..., cancelled: _Optional[_Union[RoundCancelled, _Mapping]] = ..., relay: _Optional[_Union[RelayFrame, _Mapping]] = ..., settled: _Optional[_Union[RoundSettled, _Mapping]] = ..., task: _Optional[_Union[TaskDefinition, _Mapping]] = ...) -> None: ...

class TaskDefinition(_message.Message):
    __slots__ = ("config_json",)
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    config_json: str
    def __init__(self, config_json: _Optional[str] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("party", "epsilon_cap", "accounting_json", "audit_public_key", "head")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    EPSILON_CAP_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_JSON_FIELD_NUMBER: _ClassVar[int]
    AUDIT_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    party: str
    epsilon_cap: float
    accounting_json: str
    audit_public_key: bytes
    head: AuditHead
    def __init__(self, party: _Optional[str] = ..., epsilon_cap: _Optional[float] = ..., accounting_json: _Optional[str] = ..., audit_public_key: _Optional[bytes] = ..., head: _Optional[_Union[AuditHead, _Mapping]] = ...) -> None: ...

class RoundSettled(_message.Message):
    __slots__ = ("round_id", "settlement", "answered", "head")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    SETTLEMENT_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    settlement: Settlement
    answered: bytes
    head: AuditHead
    def __init__(self, round_id: _Optional[int] = ..., settlement: _Optional[_Union[Settlement, str]] = ..., answered: _Optional[bytes] = ..., head: _Optional[_Union[AuditHead, _Mapping]] = ...) -> None: ...

class RoundWork(_message.Message):
    __slots__ = ("round_id", "queries", "mechanism", "student_public_key", "vote_weight", "frac_bits", "participation", "teachers")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    STUDENT_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    VOTE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    FRAC_BITS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPATION_FIELD_NUMBER: _ClassVar[int]
    TEACHERS_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    queries: _common_pb2.QueryBatch
    mechanism: _common_pb2.Mechanism
    student_public_key: bytes
    vote_weight: float
    frac_bits: int
    participation: bytes
    teachers: int
    def __init__(self, round_id: _Optional[int] = ..., queries: _Optional[_Union[_common_pb2.QueryBatch, _Mapping]] = ..., mechanism: _Optional[_Union[_common_pb2.Mechanism, _Mapping]] = ..., student_public_key: _Optional[bytes] = ..., vote_weight: _Optional[float] = ..., frac_bits: _Optional[int] = ..., participation: _Optional[bytes] = ..., teachers: _Optional[int] = ...) -> None: ...

class RoundCancelled(_message.Message):
    __slots__ = ("round_id", "reason")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    reason: str
    def __init__(self, round_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class OpenRoundRequest(_message.Message):
    __slots__ = ("header", "round_key", "queries", "mechanism", "student_public_key", "exclude", "hospital", "reveal_records", "retry", "revealed_by")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_KEY_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    STUDENT_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    HOSPITAL_FIELD_NUMBER: _ClassVar[int]
    REVEAL_RECORDS_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    REVEALED_BY_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    round_key: str
    queries: _common_pb2.QueryBatch
    mechanism: _common_pb2.Mechanism
    student_public_key: bytes
    exclude: _containers.RepeatedScalarFieldContainer[str]
    hospital: str
    reveal_records: bool
    retry: RetryWithout
    revealed_by: str
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., round_key: _Optional[str] = ..., queries: _Optional[_Union[_common_pb2.QueryBatch, _Mapping]] = ..., mechanism: _Optional[_Union[_common_pb2.Mechanism, _Mapping]] = ..., student_public_key: _Optional[bytes] = ..., exclude: _Optional[_Iterable[str]] = ..., hospital: _Optional[str] = ..., reveal_records: _Optional[bool] = ..., retry: _Optional[_Union[RetryWithout, _Mapping]] = ..., revealed_by: _Optional[str] = ...) -> None: ...

class RetryWithout(_message.Message):
    __slots__ = ("round_id", "party", "reason")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    party: str
    reason: str
    def __init__(self, round_id: _Optional[int] = ..., party: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SealedSeed(_message.Message):
    __slots__ = ("party", "sealed")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    party: str
    sealed: bytes
    def __init__(self, party: _Optional[str] = ..., sealed: _Optional[bytes] = ...) -> None: ...

class OpenRoundReply(_message.Message):
    __slots__ = ("round_id", "included", "excluded_remaining_epsilon", "seeds", "session_id", "teachers", "challenge")
    class ExcludedRemainingEpsilonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class TeachersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_REMAINING_EPSILON_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TEACHERS_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    included: _containers.RepeatedScalarFieldContainer[str]
    excluded_remaining_epsilon: _containers.ScalarMap[str, float]
    seeds: _containers.RepeatedCompositeFieldContainer[SealedSeed]
    session_id: bytes
    teachers: _containers.ScalarMap[str, int]
    challenge: bytes
    def __init__(self, round_id: _Optional[int] = ..., included: _Optional[_Iterable[str]] = ..., excluded_remaining_epsilon: _Optional[_Mapping[str, float]] = ..., seeds: _Optional[_Iterable[_Union[SealedSeed, _Mapping]]] = ..., session_id: _Optional[bytes] = ..., teachers: _Optional[_Mapping[str, int]] = ..., challenge: _Optional[bytes] = ...) -> None: ...

class VoteCheck(_message.Message):
    __slots__ = ("header", "round_id", "parties", "wire", "combined")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    WIRE_FIELD_NUMBER: _ClassVar[int]
    COMBINED_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    round_id: int
    parties: _containers.RepeatedScalarFieldContainer[str]
    wire: bytes
    combined: bytes
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., round_id: _Optional[int] = ..., parties: _Optional[_Iterable[str]] = ..., wire: _Optional[bytes] = ..., combined: _Optional[bytes] = ...) -> None: ...

class ExcludedVote(_message.Message):
    __slots__ = ("party", "reason")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    party: str
    reason: str
    def __init__(self, party: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class VoteCheckReply(_message.Message):
    __slots__ = ("round_id", "included", "excluded", "vote_weights", "teachers")
    class VoteWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class TeachersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDED_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FIELD_NUMBER: _ClassVar[int]
    VOTE_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TEACHERS_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    included: _containers.RepeatedScalarFieldContainer[str]
    excluded: _containers.RepeatedCompositeFieldContainer[ExcludedVote]
    vote_weights: _containers.ScalarMap[str, int]
    teachers: _containers.ScalarMap[str, int]
    def __init__(self, round_id: _Optional[int] = ..., included: _Optional[_Iterable[str]] = ..., excluded: _Optional[_Iterable[_Union[ExcludedVote, _Mapping]]] = ..., vote_weights: _Optional[_Mapping[str, int]] = ..., teachers: _Optional[_Mapping[str, int]] = ...) -> None: ...

class MpcFrame(_message.Message):
    __slots__ = ("header", "round_id", "frame")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    round_id: int
    frame: bytes
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., round_id: _Optional[int] = ..., frame: _Optional[bytes] = ...) -> None: ...

class PartyStatus(_message.Message):
    __slots__ = ("name", "role", "status", "connected", "epsilon_cap", "epsilon_spent", "epsilon_remaining", "best_order", "rounds", "last_seen", "vote_weight", "participation", "queries_left", "teachers", "registered_cap", "declared_cap", "party_epsilon_spent", "party_through_round", "party_open_rounds", "party_reported_at", "ledgers", "ledger_gap", "rounds_asked", "full_delta", "trainings", "dp_trained", "rounds_epsilon")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_CAP_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_REMAINING_FIELD_NUMBER: _ClassVar[int]
    BEST_ORDER_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_FIELD_NUMBER: _ClassVar[int]
    VOTE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PARTICIPATION_FIELD_NUMBER: _ClassVar[int]
    QUERIES_LEFT_FIELD_NUMBER: _ClassVar[int]
    TEACHERS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_CAP_FIELD_NUMBER: _ClassVar[int]
    DECLARED_CAP_FIELD_NUMBER: _ClassVar[int]
    PARTY_EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    PARTY_THROUGH_ROUND_FIELD_NUMBER: _ClassVar[int]
    PARTY_OPEN_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    PARTY_REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_GAP_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_ASKED_FIELD_NUMBER: _ClassVar[int]
    FULL_DELTA_FIELD_NUMBER: _ClassVar[int]
    TRAININGS_FIELD_NUMBER: _ClassVar[int]
    DP_TRAINED_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_EPSILON_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    status: str
    connected: bool
    epsilon_cap: float
    epsilon_spent: float
    epsilon_remaining: float
    best_order: float
    rounds: int
    last_seen: str
    vote_weight: float
    participation: float
    queries_left: int
    teachers: int
    registered_cap: float
    declared_cap: float
    party_epsilon_spent: float
    party_through_round: int
    party_open_rounds: int
    party_reported_at: str
    ledgers: str
    ledger_gap: float
    rounds_asked: int
    full_delta: float
    trainings: _containers.RepeatedCompositeFieldContainer[TrainingCharge]
    dp_trained: bool
    rounds_epsilon: float
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., status: _Optional[str] = ..., connected: _Optional[bool] = ..., epsilon_cap: _Optional[float] = ..., epsilon_spent: _Optional[float] = ..., epsilon_remaining: _Optional[float] = ..., best_order: _Optional[float] = ..., rounds: _Optional[int] = ..., last_seen: _Optional[str] = ..., vote_weight: _Optional[float] = ..., participation: _Optional[float] = ..., queries_left: _Optional[int] = ..., teachers: _Optional[int] = ..., registered_cap: _Optional[float] = ..., declared_cap: _Optional[float] = ..., party_epsilon_spent: _Optional[float] = ..., party_through_round: _Optional[int] = ..., party_open_rounds: _Optional[int] = ..., party_reported_at: _Optional[str] = ..., ledgers: _Optional[str] = ..., ledger_gap: _Optional[float] = ..., rounds_asked: _Optional[int] = ..., full_delta: _Optional[float] = ..., trainings: _Optional[_Iterable[_Union[TrainingCharge, _Mapping]]] = ..., dp_trained: _Optional[bool] = ..., rounds_epsilon: _Optional[float] = ...) -> None: ...

class TrainingCharge(_message.Message):
    __slots__ = ("epsilon", "sha256", "described", "records_json")
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    DESCRIBED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_JSON_FIELD_NUMBER: _ClassVar[int]
    epsilon: float
    sha256: str
    described: str
    records_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, epsilon: _Optional[float] = ..., sha256: _Optional[str] = ..., described: _Optional[str] = ..., records_json: _Optional[_Iterable[str]] = ...) -> None: ...

class ListPartiesRequest(_message.Message):
    __slots__ = ("header", "querier", "overrides")
    class OverridesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    HEADER_FIELD_NUMBER: _ClassVar[int]
    QUERIER_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    querier: str
    overrides: _containers.ScalarMap[str, float]
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., querier: _Optional[str] = ..., overrides: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ListPartiesReply(_message.Message):
    __slots__ = ("parties", "delta", "accounting", "querier_epsilon", "querier_hospital", "bound_queriers", "quorum", "plan_warnings")
    class QuerierEpsilonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class BoundQueriersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PARTIES_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTING_FIELD_NUMBER: _ClassVar[int]
    QUERIER_EPSILON_FIELD_NUMBER: _ClassVar[int]
    QUERIER_HOSPITAL_FIELD_NUMBER: _ClassVar[int]
    BOUND_QUERIERS_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    PLAN_WARNINGS_FIELD_NUMBER: _ClassVar[int]
    parties: _containers.RepeatedCompositeFieldContainer[PartyStatus]
    delta: float
    accounting: str
    querier_epsilon: _containers.ScalarMap[str, float]
    querier_hospital: str
    bound_queriers: _containers.ScalarMap[str, str]
    quorum: int
    plan_warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, parties: _Optional[_Iterable[_Union[PartyStatus, _Mapping]]] = ..., delta: _Optional[float] = ..., accounting: _Optional[str] = ..., querier_epsilon: _Optional[_Mapping[str, float]] = ..., querier_hospital: _Optional[str] = ..., bound_queriers: _Optional[_Mapping[str, str]] = ..., quorum: _Optional[int] = ..., plan_warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class LedgerEntry(_message.Message):
    __slots__ = ("round_id", "party", "kind", "mechanism", "round_state", "task", "queries", "epsilon_alone", "at")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    ROUND_STATE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    EPSILON_ALONE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    round_id: int
    party: str
    kind: str
    mechanism: str
    round_state: str
    task: str
    queries: int
    epsilon_alone: float
    at: str
    def __init__(self, round_id: _Optional[int] = ..., party: _Optional[str] = ..., kind: _Optional[str] = ..., mechanism: _Optional[str] = ..., round_state: _Optional[str] = ..., task: _Optional[str] = ..., queries: _Optional[int] = ..., epsilon_alone: _Optional[float] = ..., at: _Optional[str] = ...) -> None: ...

class ListLedgerRequest(_message.Message):
    __slots__ = ("header", "party", "round_id", "limit", "offset")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    party: str
    round_id: int
    limit: int
    offset: int
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., party: _Optional[str] = ..., round_id: _Optional[int] = ..., limit: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ListLedgerReply(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[LedgerEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[LedgerEntry, _Mapping]]] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("seq", "at", "actor", "action", "detail_json", "hash", "note", "signature")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    at: str
    actor: str
    action: str
    detail_json: str
    hash: str
    note: str
    signature: str
    def __init__(self, seq: _Optional[int] = ..., at: _Optional[str] = ..., actor: _Optional[str] = ..., action: _Optional[str] = ..., detail_json: _Optional[str] = ..., hash: _Optional[str] = ..., note: _Optional[str] = ..., signature: _Optional[str] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("header", "limit", "offset")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    limit: int
    offset: int
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., limit: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ListAuditReply(_message.Message):
    __slots__ = ("entries", "chain_valid", "head", "audit_public_key", "disputes")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CHAIN_VALID_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    AUDIT_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    DISPUTES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    chain_valid: bool
    head: AuditHead
    audit_public_key: str
    disputes: _containers.RepeatedCompositeFieldContainer[VoteDispute]
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ..., chain_valid: _Optional[bool] = ..., head: _Optional[_Union[AuditHead, _Mapping]] = ..., audit_public_key: _Optional[str] = ..., disputes: _Optional[_Iterable[_Union[VoteDispute, _Mapping]]] = ...) -> None: ...

class VoteDispute(_message.Message):
    __slots__ = ("querier", "party", "failures", "party_queriers", "querier_parties", "points_to")
    QUERIER_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    PARTY_QUERIERS_FIELD_NUMBER: _ClassVar[int]
    QUERIER_PARTIES_FIELD_NUMBER: _ClassVar[int]
    POINTS_TO_FIELD_NUMBER: _ClassVar[int]
    querier: str
    party: str
    failures: int
    party_queriers: int
    querier_parties: int
    points_to: str
    def __init__(self, querier: _Optional[str] = ..., party: _Optional[str] = ..., failures: _Optional[int] = ..., party_queriers: _Optional[int] = ..., querier_parties: _Optional[int] = ..., points_to: _Optional[str] = ...) -> None: ...

class BudgetHistoryRequest(_message.Message):
    __slots__ = ("header", "party", "max_points")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    MAX_POINTS_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    party: str
    max_points: int
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., party: _Optional[str] = ..., max_points: _Optional[int] = ...) -> None: ...

class BudgetPoint(_message.Message):
    __slots__ = ("at", "epsilon", "round_id")
    AT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    at: str
    epsilon: float
    round_id: int
    def __init__(self, at: _Optional[str] = ..., epsilon: _Optional[float] = ..., round_id: _Optional[int] = ...) -> None: ...

class BudgetSeries(_message.Message):
    __slots__ = ("party", "epsilon_cap", "points", "rounds_asked", "full_delta")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    EPSILON_CAP_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_ASKED_FIELD_NUMBER: _ClassVar[int]
    FULL_DELTA_FIELD_NUMBER: _ClassVar[int]
    party: str
    epsilon_cap: float
    points: _containers.RepeatedCompositeFieldContainer[BudgetPoint]
    rounds_asked: int
    full_delta: float
    def __init__(self, party: _Optional[str] = ..., epsilon_cap: _Optional[float] = ..., points: _Optional[_Iterable[_Union[BudgetPoint, _Mapping]]] = ..., rounds_asked: _Optional[int] = ..., full_delta: _Optional[float] = ...) -> None: ...

class BudgetHistoryReply(_message.Message):
    __slots__ = ("series", "delta")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[BudgetSeries]
    delta: float
    def __init__(self, series: _Optional[_Iterable[_Union[BudgetSeries, _Mapping]]] = ..., delta: _Optional[float] = ...) -> None: ...

class RecordPrivacyAuditRequest(_message.Message):
    __slots__ = ("header", "party", "canaries", "guesses", "correct", "confidence", "attack", "actor")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    CANARIES_FIELD_NUMBER: _ClassVar[int]
    GUESSES_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ATTACK_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    party: str
    canaries: int
    guesses: int
    correct: int
    confidence: float
    attack: str
    actor: str
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., party: _Optional[str] = ..., canaries: _Optional[int] = ..., guesses: _Optional[int] = ..., correct: _Optional[int] = ..., confidence: _Optional[float] = ..., attack: _Optional[str] = ..., actor: _Optional[str] = ...) -> None: ...

class PrivacyAudit(_message.Message):
    __slots__ = ("id", "party", "at", "actor", "attack", "canaries", "guesses", "correct", "confidence", "delta", "accountant", "claimed_epsilon", "empirical_lower", "empirical_point", "empirical_upper", "refuted")
    ID_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ATTACK_FIELD_NUMBER: _ClassVar[int]
    CANARIES_FIELD_NUMBER: _ClassVar[int]
    GUESSES_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_EPSILON_FIELD_NUMBER: _ClassVar[int]
    EMPIRICAL_LOWER_FIELD_NUMBER: _ClassVar[int]
    EMPIRICAL_POINT_FIELD_NUMBER: _ClassVar[int]
    EMPIRICAL_UPPER_FIELD_NUMBER: _ClassVar[int]
    REFUTED_FIELD_NUMBER: _ClassVar[int]
    id: int
    party: str
    at: str
    actor: str
    attack: str
    canaries: int
    guesses: int
    correct: int
    confidence: float
    delta: float
    accountant: str
    claimed_epsilon: float
    empirical_lower: float
    empirical_point: float
    empirical_upper: float
    refuted: bool
    def __init__(self, id: _Optional[int] = ..., party: _Optional[str] = ..., at: _Optional[str] = ..., actor: _Optional[str] = ..., attack: _Optional[str] = ..., canaries: _Optional[int] = ..., guesses: _Optional[int] = ..., correct: _Optional[int] = ..., confidence: _Optional[float] = ..., delta: _Optional[float] = ..., accountant: _Optional[str] = ..., claimed_epsilon: _Optional[float] = ..., empirical_lower: _Optional[float] = ..., empirical_point: _Optional[float] = ..., empirical_upper: _Optional[float] = ..., refuted: _Optional[bool] = ...) -> None: ...

class ListPrivacyAuditsRequest(_message.Message):
    __slots__ = ("header", "party", "limit")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    header: _common_pb2.Header
    party: str
    limit: int
    def __init__(self, header: _Optional[_Union[_common_pb2.Header, _Mapping]] = ..., party: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListPrivacyAuditsReply(_message.Message):
    __slots__ = ("audits",)
    AUDITS_FIELD_NUMBER: _ClassVar[int]
    audits: _containers.RepeatedCompositeFieldContainer[PrivacyAudit]
    def __init__(self, audits: _Optional[_Iterable[_Union[PrivacyAudit, _Mapping]]] = ...) -> None: ...
