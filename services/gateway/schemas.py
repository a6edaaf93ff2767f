"""The REST API's request and response bodies (they make the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from capc.data.generators import GENERATORS
from services.common.limits import (
    DEFAULT_BATCH,
    DEFAULT_EPOCHS,
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_RECIPE_COUNT,
    batch_refusal,
)

Generator = Literal["gaussian", "spectral", "dead_leaves", "fractal", "mix"]
if set(Generator.__args__) != set(GENERATORS):  # type: ignore[attr-defined]
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
    """Programmatic queries: images ``start`` .. ``start + count - 1`` of (generator, params, seed)."""

    generator: Generator
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


class JobCreate(Strict):
    recipe: RecipeIn
    count: int = Field(ge=1, le=MAX_RECIPE_COUNT)
    batch_size: BatchSize = DEFAULT_BATCH
    mechanism: MechanismOverride | None = None


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


class JobList(BaseModel):
    jobs: list[JobOut]
    limit: int
    offset: int


class LabelsOut(BaseModel):
    job: JobOut
    labels: list[int] | list[list[int]] = Field(
        description="per query: the class, or 0/1 per label; -1 where not answered"
    )


class ModelCreate(Strict):
    job_ids: list[JobId] = Field(min_length=1, max_length=100)
    architecture: Literal["pretrained", "small-cnn", "mlp", "resnet10", "resnet18"] | None = Field(
        None,
        description="pretrained: fit the last layer of the student's pretrained body (DIET); "
        "an architecture name: train from scratch; default: pretrained when the student has a body",
    )
    epochs: int = Field(DEFAULT_EPOCHS, ge=1, le=MAX_EPOCHS)
    seed: int = Field(0, ge=0, le=2**31 - 1)


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


class ModelList(BaseModel):
    models: list[ModelOut]


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
    registered_cap: float = Field(description="the guardian operator's ceiling on the cap")
    declared_cap: float | None = Field(
        description="the cap the party set itself (None until it connects); the enforced "
        "epsilon_cap is never above it"
    )
    own_ledger: PartyLedgerOut


class PartyList(BaseModel):
    parties: list[PartyOut]
    delta: float
    accounting: str


class BudgetOut(BaseModel):
    party: str
    epsilon_cap: float
    epsilon_spent: float
    epsilon_remaining: float
    delta: float
    best_order: float = Field(
        description="the Renyi order that gives the smallest epsilon (rdp ledgers; 0 otherwise)"
    )
    accounting: str = Field(description="the ledger's accountant, e.g. exact Gaussian DP")
    queries_left: int | None
    declared_cap: float | None
    own_ledger: PartyLedgerOut


class BudgetList(BaseModel):
    task: str
    delta: float
    accounting: str
    budgets: list[BudgetOut]


class HistoryPoint(BaseModel):
    at: str
    epsilon: float
    round_id: int


class HistorySeries(BaseModel):
    party: str
    epsilon_cap: float
    points: list[HistoryPoint]


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


class AuditPage(BaseModel):
    entries: list[AuditEntryOut]
    chain_valid: bool = Field(
        description="every link, hash and signature checks out against the guardian's key"
    )
    head: AuditHeadOut
    audit_public_key: str = Field(description="the guardian's audit signing key (hex)")
    limit: int
    offset: int


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    backends: dict[str, str]


class ErrorOut(BaseModel):
    detail: str
