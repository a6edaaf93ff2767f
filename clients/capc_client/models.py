"""What the gateway returns, as pydantic models (extra fields from a newer gateway are kept)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Mechanism(_Model):
    name: str
    outputs: int
    params: dict[str, float]


class Job(_Model):
    id: str
    state: str
    task: str
    source: str
    requested: int
    processed: int
    answered: int
    rounds: int
    progress: float
    error: str
    created_at: str
    round_seconds: float = 0.0
    mechanism: Mechanism | None = None
    records_revealed: bool = False

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


class StudentModel(_Model):
    id: str
    state: str
    job_ids: list[str]
    architecture: str
    epochs: int
    examples: int
    metrics: dict[str, Any]
    error: str
    created_at: str
    options: dict[str, Any] = {}
    #: While it trains: ``progress_done`` of ``progress_total`` ``progress_unit``.
    progress_done: int = 0
    progress_total: int = 0
    progress_unit: str = ""

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


class Loop(_Model):
    """The CaPC loop of the hospital a gateway's student party queries for: its model's
    test accuracy on its own held-out records before (own labelled records alone) and
    after (plus the labels the other hospitals returned), and what that cost them."""

    hospital: str
    querier: str
    bound_hospital: str
    before: StudentModel | None
    after: StudentModel | None
    accuracy_before: float | None
    accuracy_after: float | None
    gain: float | None
    labels_bought: int
    records_revealed: int
    jobs: int
    epsilon_by_party: dict[str, float]
    epsilon_spent: float
    #: Per answering party: queries of the task's worst case its remaining cap covers
    #: (empty from a gateway that does not report them).
    queries_left: dict[str, int] = {}


class PartyLedger(_Model):
    """A hospital's own ledger as it last reported it, beside the guardian's: ``state`` is
    agree, diverged, incomparable or unreported; ``gap`` the guardian's minus its epsilon."""

    state: str
    epsilon_spent: float
    through_round: int
    open_rounds: int
    reported_at: str | None = None
    gap: float = 0.0


_UNREPORTED = PartyLedger(state="unreported", epsilon_spent=0.0, through_round=0, open_rounds=0)


class Prediction(_Model):
    """A student model's predictions, one per record, each independent of the others."""

    model: str
    labels: list[int] | list[list[int]]
    scores: list[list[float]]


class Training(_Model):
    """A DP-SGD training charged once: its epsilon alone, digest and description."""

    epsilon: float
    sha256: str
    described: str


class Party(_Model):
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
    vote_weight: float = 1.0
    participation: float = 1.0
    queries_left: int | None = None
    teachers: int = 0
    registered_cap: float | None = None
    declared_cap: float | None = None
    own_ledger: PartyLedger = _UNREPORTED
    #: Rounds asked (R), the ledger's delta and the delta the guarantee holds at:
    #: ledger_delta + R 2^-40. None from a gateway that does not report them.
    rounds_asked: int | None = None
    ledger_delta: float | None = None
    full_delta: float | None = None
    #: DP-SGD trainings charged once each (inside epsilon_spent), the epsilon of the round
    #: charges alone, and whether the party attested DP-trained teachers. Empty, None and
    #: False from a gateway that does not report them.
    trainings: list[Training] = []
    rounds_epsilon: float | None = None
    dp_trained: bool = False


class Budget(_Model):
    party: str
    epsilon_cap: float
    epsilon_spent: float
    epsilon_remaining: float
    delta: float
    best_order: float
    accounting: str
    queries_left: int | None = None
    declared_cap: float | None = None
    own_ledger: PartyLedger = _UNREPORTED
    #: Rounds asked (R), the ledger's delta and the delta the guarantee holds at:
    #: ledger_delta + R 2^-40. None from a gateway that does not report them.
    rounds_asked: int | None = None
    ledger_delta: float | None = None
    full_delta: float | None = None
    #: DP-SGD trainings charged once each (inside epsilon_spent), the epsilon of the round
    #: charges alone, and whether the party attested DP-trained teachers. Empty, None and
    #: False from a gateway that does not report them.
    trainings: list[Training] = []
    rounds_epsilon: float | None = None
    dp_trained: bool = False


class BudgetList(_Model):
    task: str
    delta: float
    accounting: str
    budgets: list[Budget]
    #: The task re-checked against the teacher counts the connected hospitals registered.
    plan_warnings: list[str] = []


class HistoryPoint(_Model):
    at: str
    epsilon: float
    round_id: int


class HistorySeries(_Model):
    party: str
    epsilon_cap: float
    points: list[HistoryPoint]
    rounds_asked: int | None = None
    full_delta: float | None = None


class History(_Model):
    delta: float
    series: list[HistorySeries]


class LedgerEntry(_Model):
    round_id: int
    party: str
    kind: str
    mechanism: str
    round_state: str
    task: str
    queries: int
    epsilon_alone: float
    at: str


class LedgerPage(_Model):
    entries: list[LedgerEntry]
    limit: int
    offset: int
    #: The delta the entries' epsilons are at, and per party on the page its rounds
    #: asked (R) and ledger_delta + R 2^-40. None/empty from an older gateway.
    ledger_delta: float | None = None
    rounds_asked: dict[str, int] = {}
    full_delta: dict[str, float] = {}


class AuditEntry(_Model):
    seq: int
    at: str
    actor: str
    action: str
    detail: dict[str, Any]
    hash: str
    #: Free text a caller supplied: recorded, never trusted (``actor`` is authenticated).
    note: str | None = None
    signature: str = ""


class AuditHead(_Model):
    seq: int
    hash: str
    signature: str


class PrivacyAudit(_Model):
    """A canary audit of one party beside the epsilon its ledger claimed (nats)."""

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
    empirical_point: float | None
    empirical_upper: float | None
    refuted: bool


class Dispute(_Model):
    """Failed checks between one querier and one party; ``points_to`` is where the
    pattern over all pairs points: "party", "querier" or "undetermined"."""

    querier: str
    party: str
    failures: int
    party_queriers: int
    querier_parties: int
    points_to: str


class AuditPage(_Model):
    entries: list[AuditEntry]
    chain_valid: bool
    head: AuditHead | None = None
    audit_public_key: str = ""
    #: Failed checks per (querier, party) pair over the whole log (not only this page).
    disputes: list[Dispute] = []
    limit: int
    offset: int
