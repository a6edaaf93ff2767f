"""The guardian's ledger views on the wire: a party's status, a privacy audit, the audit
log's head. Plain field copies: what the ledger says is computed there, not here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.common.ledger import PartyBudget, PrivacyAudit
from services.common.ledger.audit import AuditHead
from services.proto.capc.v1 import guardian_pb2

if TYPE_CHECKING:  # the guardian's own comparison; serde needs only its fields
    from services.guardian.budgets import Comparison

#: A party nobody has projected a round for: weight 1, always asked, queries left unknown.
NO_PROJECTION: tuple[float, float, int] = (1.0, 1.0, -1)


def party_status_to_proto(
    budget: PartyBudget,
    delta: float,
    own: Comparison,
    connected: bool = False,
    projection: tuple[float, float, int] = NO_PROJECTION,
    teachers: int = 0,
) -> guardian_pb2.PartyStatus:
    """One party's row of ListParties: the guardian's ledger for ``budget`` (epsilon at
    ``delta``), the party's own ledger beside it (``own``), and for a task the round's
    projection (vote weight, participation rate, queries left; -1: unknown)."""
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
    )


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
