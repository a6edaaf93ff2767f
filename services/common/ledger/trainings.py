"""DP-trained teachers in the ledger: each party's DP-SGD training, charged once per
attested digest, checked against its cap first, audited in the same transaction.

The rules are :mod:`capc.round.training`'s (the in-memory ledger keeps the same);
here each charge is one transaction: the party's spend row is locked, a training of
the same digest found there charges nothing, otherwise the charge is checked
against the enforced cap (refused with nothing written), added to the running
total, stored with its records and event, and appended to the audit log.
"""

from __future__ import annotations

import numpy as np
from sqlalchemy import select

from capc.round.errors import UnknownPartyError
from capc.round.ledger import round_up
from capc.round.training import Attestation, TrainingCharge, refusal
from services.common.ledger.base import LedgerBase
from services.common.ledger.models import PartyRow, SpendRow, TrainingRow

#: The audit action of a charged training.
ACTION = "dp_training"


class Trainings(LedgerBase):
    """Parties' DP-SGD trainings."""

    def charge_training(
        self, party: str, attestation: Attestation, *, actor: str, fix: str = ""
    ) -> TrainingCharge:
        """Charge ``party`` the training ``attestation`` covers, once per its digest:
        TrainingRefusedError (nothing written) when it would take the party past its
        enforced cap; the same digest again charges nothing (``charged`` False).
        ``fix``: what to do, said in a refusal."""
        loss = self._loss(attestation.event(), f"DP-SGD training of {party}")
        epsilon = self._eps(loss)[0]
        with self._tx() as s:
            # The spend row first, as every charge of the party locks it: concurrent
            # charges of one digest wait here, and the second finds the first's row.
            spend = s.get(SpendRow, party, with_for_update=True)
            row = s.get(PartyRow, party)
            if spend is None or row is None:
                raise UnknownPartyError(f"no party named {party!r}")
            known = s.scalar(
                select(TrainingRow).where(
                    TrainingRow.party == party, TrainingRow.digest == attestation.digest
                )
            )
            if known is not None:
                return TrainingCharge(party, attestation, float(known.epsilon), False)
            total = np.asarray(spend.loss, dtype=np.float64)
            after = round_up(total + loss, total, loss)
            if not self._fits(after, row.epsilon_cap):
                raise refusal(party, epsilon, self._eps(total)[0], row.epsilon_cap, self.delta, fix)
            spend.loss = after.tolist()
            charge = TrainingCharge(party, attestation, epsilon, True)
            s.add(
                TrainingRow(
                    party=party,
                    digest=attestation.digest,
                    records=[r.to_dict() for r in attestation.records],
                    event=attestation.event().to_dict(),
                    loss=loss.tolist(),
                    epsilon=epsilon,
                    actor=actor,
                )
            )
            self._audit(s, actor, ACTION, {**charge.to_dict(), "spent_after": self._eps(after)[0]})
        return charge

    def trainings(self, party: str | None = None) -> list[TrainingCharge]:
        """The trainings charged (of ``party``, when given), oldest first."""
        q = select(TrainingRow).order_by(TrainingRow.id)
        if party is not None:
            q = q.where(TrainingRow.party == party)
        with self._tx() as s:
            rows = list(s.scalars(q))
        return [
            TrainingCharge(
                r.party,
                Attestation.from_dict({"records": r.records, "sha256": r.digest}),
                float(r.epsilon),
                False,
            )
            for r in rows
        ]


__all__ = ["ACTION", "Trainings"]
