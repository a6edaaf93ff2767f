"""The ledgers on the wire: a party's status, a privacy audit, the audit log's head, and
what a party and the guardian tell each other of their ledgers on connecting and
after rounds (Register, Registered, SpendReport). Plain field copies, and the checks
on a report that arrives: what a ledger says is computed there, not here."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Protocol

from capc.privacy.dp_training import DpTrainingError
from capc.round.training import MAX_RECORDS, Attestation, TrainingCharge
from services.common.ledger import PartyBudget, PrivacyAudit
from services.common.ledger.audit import AuditHead
from services.common.protocol import RequestError
from services.proto.capc.v1 import guardian_pb2


class OwnLedger(Protocol):
    """A party's own ledger beside the guardian's (the guardian's comparison), as this module reads it."""

    @property
    def state(self) -> str: ...

    @property
    def party_spent(self) -> float: ...

    @property
    def through(self) -> int: ...

    @property
    def open_rounds(self) -> int: ...

    @property
    def reported_at(self) -> str: ...

    @property
    def gap(self) -> float: ...


#: Loss vectors longer than this are refused in a report (an RDP grid has a few hundred).
MAX_LOSS_ENTRIES = 10_000
#: Characters of a report's accounting description kept.
MAX_REPORTED_ACCOUNTING = 4096

#: A party nobody has projected a round for: weight 1, always asked, queries left unknown.
NO_PROJECTION: tuple[float, float, int] = (1.0, 1.0, -1)


def party_status_to_proto(
    budget: PartyBudget,
    delta: float,
    own: OwnLedger,
    connected: bool = False,
    projection: tuple[float, float, int] = NO_PROJECTION,
    teachers: int = 0,
    trainings: Sequence[TrainingCharge] = (),
    dp_trained: bool = False,
    rounds_epsilon: float | None = None,
) -> guardian_pb2.PartyStatus:
    """One party's row of ListParties: the guardian's ledger for ``budget`` (epsilon at
    ``delta``), the party's own ledger beside it (``own``), and for a task the round's
    projection (vote weight, participation rate, queries left; -1: unknown); its
    ``trainings`` charged once, whether its stream attested DP-trained teachers, and the
    epsilon of its round charges alone (default: all it spent)."""
    weight, participation, queries_left = projection
    b = budget
    return guardian_pb2.PartyStatus(
        teachers=teachers,
        registered_cap=b.registered_cap,
        declared_cap=b.declared_cap or 0.0,
        party_epsilon_spent=own.party_spent,
        party_through_round=own.through,
        party_open_rounds=own.open_rounds,
        party_reported_at=own.reported_at,
        ledgers=own.state,
        ledger_gap=own.gap,
        vote_weight=weight,
        participation=participation,
        queries_left=queries_left,
        name=b.name,
        role=b.role,
        status=b.status,
        connected=connected,
        epsilon_cap=b.cap,
        epsilon_spent=b.spent,
        epsilon_remaining=b.remaining,
        best_order=b.best_order or 0.0,
        rounds=b.rounds,
        last_seen=b.last_seen.isoformat() if b.last_seen else "",
        rounds_asked=b.rounds_asked,
        full_delta=b.full_delta(delta),
        trainings=[training_to_proto(t) for t in trainings],
        dp_trained=dp_trained,
        rounds_epsilon=b.spent if rounds_epsilon is None else rounds_epsilon,
    )


def training_to_proto(t: TrainingCharge) -> guardian_pb2.TrainingCharge:
    """A training charged once: its epsilon alone, digest, description and records."""
    return guardian_pb2.TrainingCharge(
        epsilon=t.epsilon,
        sha256=t.attestation.digest,
        described=t.attestation.describe(),
        records_json=[json.dumps(r.to_dict(), sort_keys=True) for r in t.attestation.records],
    )


def attestation_to_proto(a: Attestation) -> guardian_pb2.DpAttestation:
    return guardian_pb2.DpAttestation(
        records_json=[json.dumps(r.to_dict(), sort_keys=True) for r in a.records],
        sha256=a.digest,
    )


def attestation_from_proto(msg: guardian_pb2.DpAttestation) -> Attestation:
    """A party's attestation; RequestError says what is malformed."""
    if len(msg.records_json) > MAX_RECORDS:
        raise RequestError(f"a DP-training attestation holds at most {MAX_RECORDS} records")
    try:
        records = [json.loads(r) for r in msg.records_json]
        return Attestation.from_dict({"records": records, "sha256": msg.sha256})
    except (ValueError, DpTrainingError) as err:
        raise RequestError(f"malformed DP-training attestation: {err}") from None


def privacy_audit_to_proto(a: PrivacyAudit) -> guardian_pb2.PrivacyAudit:
    """A recorded privacy audit; the optional point and upper bounds stay unset when None."""
    out = guardian_pb2.PrivacyAudit(
        id=a.id,
        party=a.party,
        at=a.at,
        actor=a.actor,
        attack=a.attack,
        canaries=a.canaries,
        guesses=a.guesses,
        correct=a.correct,
        confidence=a.confidence,
        delta=a.delta,
        accountant=a.accountant,
        claimed_epsilon=a.claimed_epsilon,
        empirical_lower=a.empirical_lower,
        refuted=a.refuted,
    )
    if a.empirical_point is not None:
        out.empirical_point = a.empirical_point
    if a.empirical_upper is not None:
        out.empirical_upper = a.empirical_upper
    return out


def audit_head_to_proto(head: AuditHead) -> guardian_pb2.AuditHead:
    return guardian_pb2.AuditHead(seq=head.seq, hash=head.hash, signature=head.signature)


def audit_head_from_proto(msg: guardian_pb2.AuditHead) -> AuditHead:
    return AuditHead(int(msg.seq), msg.hash, msg.signature)


def register_to_proto(
    teachers: Sequence[guardian_pb2.TeacherInfo],
    cap: float,
    accounting_json: str,
    open_rounds: Sequence[int],
    cap_reason: str,
    attestation: Attestation | None = None,
) -> guardian_pb2.Register:
    """A party's first message on its stream: its teachers, its own ``cap`` (epsilon), its
    ledger's accounting, the rounds it holds open, why its cap rose (if it did) and the
    attestation of its teachers' DP-SGD training (None: ordinary teachers)."""
    msg = guardian_pb2.Register(
        teachers=list(teachers),
        epsilon_cap=cap,
        accounting_json=accounting_json,
        open_rounds=list(open_rounds),
        cap_reason=cap_reason,
    )
    if attestation is not None:
        msg.dp_training.CopyFrom(attestation_to_proto(attestation))
    return msg


def registered_to_proto(
    party: str, cap: float, accounting_json: str, key_hex: str | None, head: AuditHead
) -> guardian_pb2.Registered:
    """The guardian's reply to a Register: the cap it enforces for ``party``, its
    ledger's accounting, its audit key (hex; None: it signs nothing) and head."""
    return guardian_pb2.Registered(
        party=party,
        epsilon_cap=cap,
        accounting_json=accounting_json,
        audit_public_key=b"" if key_hex is None else bytes.fromhex(key_hex),
        head=audit_head_to_proto(head),
    )


def spend_report_to_proto(
    through: int,
    settled_loss: Sequence[float],
    spent: float,
    cap: float,
    open_rounds: int,
    accounting_json: str,
) -> guardian_pb2.SpendReport:
    """A party's own ledger as the guardian's admin view compares it: the loss of the
    rounds it settled through round ``through``, its spend and cap (epsilon), how many
    rounds it holds open and its accounting."""
    return guardian_pb2.SpendReport(
        through_round=through,
        settled_loss=list(settled_loss),
        epsilon_spent=spent,
        epsilon_cap=cap,
        open_rounds=open_rounds,
        accounting_json=accounting_json,
    )


def spend_report_from_proto(report: guardian_pb2.SpendReport) -> dict[str, object]:
    """A party's report as its ledger row keeps it; RequestError when a number in it is
    not finite and non-negative, or its loss vector is too long."""
    loss = list(report.settled_loss)
    if len(loss) > MAX_LOSS_ENTRIES or not all(math.isfinite(x) and x >= 0 for x in loss):
        raise RequestError(
            f"a spend report carries at most {MAX_LOSS_ENTRIES} finite, non-negative losses"
        )
    # Every number a party sends is checked: a NaN would reach the stored JSON, which
    # PostgreSQL refuses, and the stream would end on an error nobody reads.
    for field, value in (
        ("epsilon_spent", report.epsilon_spent),
        ("epsilon_cap", report.epsilon_cap),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise RequestError(f"a spend report's {field} must be finite and >= 0, got {value}")
    return {
        "through": int(report.through_round),
        "settled": loss,
        "epsilon_spent": float(report.epsilon_spent),
        "epsilon_cap": float(report.epsilon_cap),
        "open_rounds": int(report.open_rounds),
        "accounting": report.accounting_json[:MAX_REPORTED_ACCOUNTING],
    }
