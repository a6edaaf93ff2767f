"""Empirical privacy audits: a canary attack's counts on a party, beside the epsilon its
ledger claims (:mod:`capc.audit.bounds` turns the counts into an empirical epsilon)."""

from __future__ import annotations

import math

from sqlalchemy import select
from sqlalchemy.orm import Session

from capc.audit import bounds
from capc.round.errors import LedgerValueError, UnknownPartyError
from services.common.db import iso_utc
from services.common.ledger.base import LedgerBase
from services.common.ledger.models import AuditResultRow, SpendRow
from services.common.ledger.records import PrivacyAudit

#: Most canaries one audit may report (a bound on what the ledger is asked to store).
MAX_CANARIES = 1_000_000


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


class EmpiricalAudits(LedgerBase):
    """Recorded canary attacks on the ledger's parties."""

    def record_privacy_audit(
        self,
        party: str,
        *,
        canaries: int,
        guesses: int,
        correct: int,
        attack: str,
        confidence: float = 0.95,
        actor: str,
        note: str | None = None,
    ) -> PrivacyAudit:
        """Record a canary attack's counts on ``party`` beside the epsilon its ledger claims
        now. The empirical epsilon is computed here from the counts (the caller's own
        arithmetic is not taken), at the ledger's delta; the record is audited."""
        for name, value in (("canaries", canaries), ("guesses", guesses), ("correct", correct)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LedgerValueError(f"{name} must be a whole number >= 0, got {value!r}")
        if not 1 <= canaries <= MAX_CANARIES or not correct <= guesses <= canaries:
            raise LedgerValueError(
                f"need 1 <= canaries <= {MAX_CANARIES} and correct <= guesses <= canaries, got "
                f"{correct} right of {guesses} guesses on {canaries} canaries"
            )
        if not 0.5 <= confidence < 1.0:
            raise LedgerValueError(f"confidence must lie in [0.5, 1), got {confidence}")
        if not attack or len(attack) > 256:
            raise LedgerValueError("describe the attack in 1 to 256 characters")
        empirical = bounds.empirical_epsilon(
            correct, guesses, canaries, delta=self.delta, confidence=confidence
        )
        with self._tx() as s:
            spend = s.get(SpendRow, party)
            if spend is None:
                raise UnknownPartyError(f"no party named {party!r}")
            claimed = self._eps(spend.loss)[0]
            row = AuditResultRow(
                party=party,
                actor=actor,
                attack=attack,
                canaries=canaries,
                guesses=guesses,
                correct=correct,
                confidence=float(confidence),
                delta=self.delta,
                accountant=self.accounting.name,
                claimed_epsilon=claimed,
                empirical_lower=empirical.lower,
                empirical_point=_finite(empirical.point),
                empirical_upper=_finite(empirical.upper),
                refuted=empirical.exceeds(claimed),
            )
            s.add(row)
            s.flush()
            self._audit(
                s,
                actor,
                "privacy_audit",
                {
                    "id": row.id,
                    "party": party,
                    "claimed_epsilon": claimed,
                    "empirical_lower": empirical.lower,
                    "canaries": canaries,
                    "guesses": guesses,
                    "correct": correct,
                    "refuted": row.refuted,
                },
                None if note is None else note[:1000],
            )
            return self._privacy_audit(row)

    @staticmethod
    def _privacy_audit(r: AuditResultRow) -> PrivacyAudit:
        return PrivacyAudit(
            id=r.id,
            party=r.party,
            at=iso_utc(r.at),
            actor=r.actor,
            attack=r.attack,
            canaries=r.canaries,
            guesses=r.guesses,
            correct=r.correct,
            confidence=r.confidence,
            delta=r.delta,
            accountant=r.accountant,
            claimed_epsilon=r.claimed_epsilon,
            empirical_lower=r.empirical_lower,
            empirical_point=r.empirical_point,
            empirical_upper=r.empirical_upper,
            refuted=r.refuted,
        )

    def privacy_audits(self, party: str | None = None, limit: int = 100) -> list[PrivacyAudit]:
        """Recorded audits, newest first (of ``party`` only, when given)."""
        q = select(AuditResultRow)
        if party is not None:
            q = q.where(AuditResultRow.party == party)
        with Session(self.engine) as s:
            rows = s.scalars(q.order_by(AuditResultRow.id.desc()).limit(limit))
            return [self._privacy_audit(r) for r in rows]
