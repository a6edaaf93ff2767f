"""The REST API's request and response bodies (they make the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from capc.data.generators import GENERATORS
from capc.data.table_queries import TABLE_GENERATORS
from services.common.limits import (
    DEFAULT_BATCH,
    DEFAULT_EPOCHS,
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_OWN_WEIGHT,
    MAX_PREDICT_RECORDS,
    MAX_RECIPE_COUNT,
    batch_refusal,
)

#: Image generators, then table generators (rows from the task's public feature ranges).
Generator = Literal["gaussian", "spectral", "dead_leaves", "fractal", "mix", "uniform", "beta"]
if set(Generator.__args__) != {*GENERATORS, *TABLE_GENERATORS}:  # type: ignore[attr-defined]
    raise RuntimeError("the REST enum must list every generator")
ID_PATTERN = r"^[0-9a-f-]{36}$"
JobId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]


def _batch_size(size: int) -> int:
    refusal = batch_refusal(size)
    if refusal is not None:
        raise ValueError(f"batch_size: {refusal}")
    return size


#: Queries per round, refused in the words the student party and guardian use; the
#: schema still shows the bounds.
BatchSize = Annotated[
    int,
    AfterValidator(_batch_size),
    Field(json_schema_extra={"minimum": 1, "maximum": MAX_BATCH}),
]


class Strict(BaseModel):
    """Inputs: unknown fields and NaN or infinite numbers are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class RecipeIn(Strict):
    """Programmatic queries: records ``start`` .. ``start + count - 1`` of (generator, params,
    seed): images for an image task, rows drawn from the public feature ranges (``uniform``,
    ``beta``) for a table task."""

    generator: Generator | None = Field(
        None, description="default: gaussian for an image task, beta for a table task"
    )
    params: dict[str, float | int | list[float] | list[str]] = Field(
        default_factory=dict, description="generator parameters; see capc.data.generators"
    )
    seed: int = Field(0, ge=0, le=2**62)
    start: int = Field(0, ge=0, le=2**40)


ParamName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
ParamValue = Annotated[float, Field(gt=0, le=1e6)]
#: A job's mechanism overrides: parameter -> value, by the names the task's mechanism
#: gives them (e.g. sigma, sigma1, threshold). The mechanism's own rule decides: only
#: more noise or a higher threshold.
MechanismOverride = Annotated[dict[ParamName, ParamValue], Field(max_length=16)]


#: allow_partial's description, in the JSON body and the upload form alike.
ALLOW_PARTIAL = (
    "label only as many queries as the answering hospitals' caps cover, and stop. "
    "Without it a job they cannot cover in full is refused (409) before anything is spent"
)


class JobCreate(Strict):
    recipe: RecipeIn
    count: int = Field(ge=1, le=MAX_RECIPE_COUNT)
    batch_size: BatchSize = DEFAULT_BATCH
    mechanism: MechanismOverride | None = None
    allow_partial: bool = Field(False, description=ALLOW_PARTIAL)


class MechanismOut(BaseModel):
    name: str
    outputs: int = Field(description="classes (single label) or labels (multi-label)")
    params: dict[str, float]


class JobOut(BaseModel):
    id: str
    state: str
    task: str
    source: str
    requested: int
    processed: int
    answered: int
    rounds: int
    progress: float = Field(description="processed / requested, in [0, 1]")
    error: str
    created_at: str
    round_seconds: float
    mechanism: MechanismOut | None
    records_revealed: bool = Field(
        False,
        description="its records went to the answering hospitals in the clear, by the "
        "querying hospital's explicit choice (audited by the guardian)",
    )


class JobList(BaseModel):
    jobs: list[JobOut]
    limit: int
    offset: int


class LabelsOut(BaseModel):
    job: JobOut
    labels: list[int] | list[list[int]] = Field(
        description="per query: the class, or 0/1 per label; -1 where not answered"
    )


#: How a student also learns from unanswered queries (the student party's
#: ``SEMI_SUPERVISED``; a unit test keeps the two equal). "pseudo-labels" is deprecated.
SemiSupervised = Literal["none", "self-training", "pseudo-label-head", "fixmatch", "pseudo-labels"]


class ModelCreate(Strict):
    job_ids: list[JobId] = Field(
        max_length=100,
        description="finished jobs whose labels it learns; none only for a querier with its "
        "own labelled records (the CaPC loop: its model before it queried the consortium)",
    )
    architecture: Literal["pretrained", "small-cnn", "mlp", "resnet10", "resnet18"] | None = Field(
        None,
        description="pretrained: fit the last layer of the student's pretrained body (DIET); "
        "an architecture name: train from scratch; default: pretrained when the student has a body",
    )
    epochs: int = Field(DEFAULT_EPOCHS, ge=1, le=MAX_EPOCHS)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    l2: float | None = Field(
        None,
        ge=1e-8,
        le=1e3,
        description="pretrained students: the head's L2 penalty (default 0.01)",
    )
    semi_supervised: SemiSupervised = Field(
        "none",
        description="also learn from the jobs' unanswered queries: a pretrained student's head "
        "by its own confident predictions (self-training) or by confident predictions taught "
        "on strongly augmented views (pseudo-label-head); a student trained from scratch by "
        "FixMatch (fixmatch, image tasks); no privacy cost. Deprecated: pseudo-labels, read "
        "as pseudo-label-head or fixmatch by the architecture (options.deprecated says so)",
    )
    own_weight: int | None = Field(
        None,
        ge=1,
        le=MAX_OWN_WEIGHT,
        strict=True,
        description="a querier's pretrained student (the CaPC loop): how many times its own "
        "labelled records enter the fit beside the bought labels (default 1); no privacy cost",
    )


class PredictIn(Strict):
    """Records to predict: a list of N records, each of the task's input shape."""

    records: list[Any] = Field(
        min_length=1,
        max_length=MAX_PREDICT_RECORDS,
        description="N records (1 <= N <= 4096), each a nested list of the task's input shape "
        "(e.g. [1][28][28] numbers)",
    )


class PredictOut(BaseModel):
    model: str
    labels: list[int] | list[list[int]] = Field(
        description="per record: its class, or 0/1 per label for a multi-label task"
    )
    scores: list[list[float]] = Field(
        description="per record: class probabilities (softmax), or each label's probability"
    )


class ModelOut(BaseModel):
    id: str
    state: str
    job_ids: list[str]
    architecture: str
    epochs: int
    examples: int
    metrics: dict[str, Any]
    error: str
    created_at: str
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="the training options the model was asked for (l2, semi_supervised, "
        "own_weight where not 1), and "
        "deprecated where the request named a deprecated method: what it was read as",
    )
    progress_done: int = Field(
        0, description="while it trains: how much of its training is done, in progress_unit"
    )
    progress_total: int = Field(0, description="...of this many (0: no progress reported)")
    progress_unit: str = Field(
        "", description="epochs, or candidate fits for the CaPC loop's before model"
    )


class ModelList(BaseModel):
    models: list[ModelOut]


class LoopOut(BaseModel):
    """The CaPC loop of the hospital this gateway's student party queries for."""

    hospital: str = Field(description="the hospital the student party queries for")
    querier: str = Field(description="its certificate name, charged in the guardian's ledger")
    bound_hospital: str = Field(
        description="the hospital the guardian bound the querier to; its teachers never vote "
        "on the querier's rounds ('' when unbound)"
    )
    before: ModelOut | None = Field(description="newest finished model of own records alone")
    after: ModelOut | None = Field(description="newest finished model of own records + labels")
    accuracy_before: float | None = Field(description="test accuracy on own held-out records")
    accuracy_after: float | None
    gain: float | None = Field(description="accuracy_after - accuracy_before")
    labels_bought: int = Field(description="queries the consortium answered, over every job")
    records_revealed: int = Field(description="own records sent in the clear, by choice")
    jobs: int
    epsilon_by_party: dict[str, float] = Field(
        description="epsilon (at the ledger's delta) the querier's rounds charged each party"
    )
    epsilon_spent: float = Field(
        description="the largest of epsilon_by_party (0 for none): each party's total, "
        "composed over the querier's rounds, not a sum of per-round or per-label figures"
    )
    queries_left: dict[str, int] = Field(
        default_factory=dict,
        description="per answering party (the bound hospital left out): queries of the "
        "task's worst case its remaining cap covers; a loop labels at most the least of "
        "them (capcctl loop run checks this before it spends)",
    )


class LoopSpend(BaseModel):
    """One CaPC loop as the guardian sees it: a querier bound to its hospital, and what
    its rounds charged the other hospitals (its accuracy lives at its own student party:
    that hospital's gateway's GET /v1/loop)."""

    hospital: str = Field(description="the hospital the querier labels records for")
    querier: str = Field(description="the querier's certificate name")
    epsilon_by_party: dict[str, float] = Field(
        description="epsilon (at the ledger's delta) its rounds charged each party: each "
        "one's total, composed over every round"
    )
    epsilon_spent: float = Field(description="the largest of epsilon_by_party (0 for none)")


class LoopList(BaseModel):
    """Every CaPC loop the guardian bound, whichever gateway each runs over."""

    loops: list[LoopSpend]


LedgerState = Literal["agree", "diverged", "incomparable", "unreported"]


class PartyLedgerOut(BaseModel):
    """The party's own ledger, as it last reported it, beside the guardian's."""

    state: LedgerState = Field(
        description="agree / diverged (the two ledgers disagree over the rounds both have "
        "settled) / incomparable (another accountant or delta) / unreported"
    )
    epsilon_spent: float = Field(description="the party's own spend, open rounds included")
    through_round: int = Field(description="the party has settled every round up to this one")
    open_rounds: int
    reported_at: str | None
    gap: float = Field(description="guardian's minus the party's epsilon through that round")


class TrainingOut(BaseModel):
    """A DP-SGD training charged once (its teachers' digest), apart from round charges."""

    epsilon: float = Field(description="the training alone, at the ledger's delta")
    sha256: str = Field(description="SHA-256 of the teacher files and records it covers")
    described: str = Field(description='how it was trained, e.g. "DP-SGD, 300 steps, sigma 7.2"')


class PartyOut(BaseModel):
    name: str
    role: str
    status: str
    connected: bool
    last_seen: str | None
    epsilon_cap: float
    epsilon_spent: float
    epsilon_remaining: float
    best_order: float
    rounds: int
    vote_weight: float
    participation: float
    queries_left: int | None = Field(
        description="queries its remaining budget covers at the task's worst case"
    )
    teachers: int = Field(
        0, description="teachers the party votes with while connected (an ensemble); 0 offline"
    )
    registered_cap: float = Field(description="the guardian operator's ceiling on the cap")
    declared_cap: float | None = Field(
        description="the cap the party set itself (None until it connects); the enforced "
        "epsilon_cap is never above it"
    )
    rounds_asked: int = Field(
        description="rounds the party was asked to vote in, aborted ones included (R)"
    )
    ledger_delta: float = Field(
        description="the ledger's delta, without the ring-conversion term: epsilon_spent "
        "is read at it"
    )
    full_delta: float = Field(
        description="the delta the party's guarantee holds at: the noise cut-off's "
        "(ledger_delta + e^epsilon_spent p) / (1 - p), p the chance that a noise value of "
        "its R rounds left the circuits' 9 sigma range, plus R 2^-40 (the validity proofs' "
        "ring conversion fails with probability at most 2^-40 a round); the guarantee is "
        "(epsilon_spent, full_delta)"
    )
    own_ledger: PartyLedgerOut
    trainings: list[TrainingOut] = Field(
        default_factory=list,
        description="DP-SGD trainings charged once each (in epsilon_spent, apart from rounds)",
    )
    rounds_epsilon: float = Field(
        0.0, description="epsilon of its round charges alone, without its trainings"
    )
    dp_trained: bool = Field(False, description="its connected stream attested DP-trained teachers")


#: plan_warnings' description, in the party and budget lists alike.
PLAN_WARNINGS = (
    "the task re-checked against the teacher counts the connected hospitals registered: "
    "rounds of the quorum that would label mostly noise, a hospital with a tiny share of "
    "the vote for the same epsilon ([] when all is well)"
)


class PartyList(BaseModel):
    parties: list[PartyOut]
    delta: float
    accounting: str
    plan_warnings: list[str] = Field(default_factory=list, description=PLAN_WARNINGS)


class BudgetOut(BaseModel):
    party: str
    epsilon_cap: float
    epsilon_spent: float
    epsilon_remaining: float
    delta: float = Field(description="the ledger's delta (= ledger_delta; see full_delta)")
    best_order: float = Field(
        description="the Renyi order that gives the smallest epsilon (rdp ledgers; 0 otherwise)"
    )
    accounting: str = Field(description="the ledger's accountant, e.g. exact Gaussian DP")
    queries_left: int | None
    rounds_asked: int = Field(
        description="rounds the party was asked to vote in, aborted ones included (R)"
    )
    ledger_delta: float = Field(
        description="the ledger's delta, without the ring-conversion term: epsilon_spent "
        "is read at it"
    )
    full_delta: float = Field(
        description="the delta the party's guarantee holds at: the noise cut-off's "
        "(ledger_delta + e^epsilon_spent p) / (1 - p), p the chance that a noise value of "
        "its R rounds left the circuits' 9 sigma range, plus R 2^-40 (the validity proofs' "
        "ring conversion fails with probability at most 2^-40 a round); the guarantee is "
        "(epsilon_spent, full_delta)"
    )
    declared_cap: float | None
    own_ledger: PartyLedgerOut
    trainings: list[TrainingOut] = Field(
        default_factory=list,
        description="DP-SGD trainings charged once each (in epsilon_spent, apart from rounds)",
    )
    rounds_epsilon: float = Field(
        0.0, description="epsilon of its round charges alone, without its trainings"
    )
    dp_trained: bool = Field(False, description="its connected stream attested DP-trained teachers")


class BudgetList(BaseModel):
    task: str
    delta: float
    accounting: str
    budgets: list[BudgetOut]
    plan_warnings: list[str] = Field(default_factory=list, description=PLAN_WARNINGS)


class HistoryPoint(BaseModel):
    at: str
    epsilon: float
    round_id: int


class HistorySeries(BaseModel):
    party: str
    epsilon_cap: float
    points: list[HistoryPoint]
    rounds_asked: int = Field(description="rounds asked so far (R)")
    full_delta: float = Field(
        description="the delta the guarantee holds at now: with the noise cut-off, + R 2^-40"
    )


class History(BaseModel):
    delta: float
    series: list[HistorySeries]


class LedgerEntryOut(BaseModel):
    round_id: int
    party: str
    kind: str
    mechanism: str
    round_state: str
    task: str
    queries: int
    epsilon_alone: float = Field(
        description="this entry's epsilon on its own, at the ledger's delta"
    )
    at: str


class LedgerPage(BaseModel):
    entries: list[LedgerEntryOut]
    limit: int
    offset: int
    ledger_delta: float = Field(description="the ledger's delta: each epsilon_alone is at it")
    rounds_asked: dict[str, int] = Field(
        description="per party on this page: rounds asked so far, aborted ones included (R)"
    )
    full_delta: dict[str, float] = Field(
        description="per party on this page: the delta its guarantee holds at now, "
        "ledger_delta with the noise cut-off's term, + R 2^-40"
    )


class AuditEntryOut(BaseModel):
    seq: int
    at: str
    actor: str = Field(description="the authenticated identity that acted")
    action: str
    detail: dict[str, Any]
    hash: str
    note: str | None = Field(description="free text the caller supplied: never trusted")
    signature: str = Field(description="the guardian's Ed25519 signature of the head (hex)")


class AuditHeadOut(BaseModel):
    seq: int
    hash: str
    signature: str


class DisputeOut(BaseModel):
    """Failed checks between one querier and one party (audit action ``dispute``)."""

    querier: str
    party: str
    failures: int = Field(description="failed checks between the two")
    party_queriers: int = Field(description="queriers this party has failed checks with")
    querier_parties: int = Field(description="parties this querier has failed checks with")
    points_to: Literal["party", "querier", "undetermined"] = Field(
        description="which side the pattern over all pairs points to; one failed check, "
        "or many within one pair, points nowhere: either side can cause it"
    )


class AuditPage(BaseModel):
    entries: list[AuditEntryOut]
    chain_valid: bool = Field(
        description="every link, hash and signature checks out against the guardian's key"
    )
    head: AuditHeadOut
    audit_public_key: str = Field(description="the guardian's audit signing key (hex)")
    disputes: list[DisputeOut] = Field(
        description="failed checks per (querier, party) pair over the whole log"
    )
    limit: int
    offset: int


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    backends: dict[str, str]
    age_s: float = Field(description="seconds since the backends were last read")


class ErrorOut(BaseModel):
    detail: str


class PrivacyAuditOut(BaseModel):
    """An empirical audit beside the epsilon the ledger claimed when it was recorded."""

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
    claimed_epsilon: float = Field(description="the party's epsilon by the ledger (nats)")
    empirical_lower: float = Field(description="lower end of the empirical epsilon's interval")
    empirical_point: float | None = Field(description="at the observed accuracy; null: unbounded")
    empirical_upper: float | None = Field(description="upper end; null: unbounded")
    refuted: bool = Field(
        description="the lower end of the 99.9% interval exceeds the claimed epsilon"
    )


class PrivacyAuditList(BaseModel):
    audits: list[PrivacyAuditOut]
