"""The guardian's SQL ledger behind the round core's ledger port (:class:`capc.round.RoundLedger`).

Only calls the ledger's public methods; each is one transaction there. The SQL
ledger raises and returns the core's types, so this port only names the guardian
as the actor of each step.
"""

from __future__ import annotations

from collections.abc import Mapping

from capc.privacy.accountants import Accounting
from capc.privacy.events import DpEvent
from capc.round.ledger import Reservation, RoundRecord, RoundState
from services.common.ledger import Ledger


class SqlRoundLedger:
    """``ledger`` as the round core's ledger port; the guardian acts as ``actor``."""

    def __init__(self, ledger: Ledger, actor: str = "guardian") -> None:
        self.sql = ledger
        self.actor = actor

    @property
    def accounting(self) -> Accounting:
        return self.sql.accounting

    @property
    def delta(self) -> float:
        return self.sql.delta

    def caps(self) -> Mapping[str, float]:
        # Read per round: the caps alone, not every party's spend worked out to epsilon.
        return self.sql.caps("answerer")

    def remaining(self, party: str) -> float:
        return self.sql.budget(party).remaining

    def reserve(
        self,
        round_key: str,
        task: str,
        querier: str,
        queries: int,
        worst_case: Mapping[str, DpEvent],
        *,
        mechanism: str,
        quorum: int,
        disclosure: Mapping[str, object] | None = None,
    ) -> Reservation:
        return self.sql.reserve(
            round_key,
            task,
            querier,
            queries,
            worst_case,
            mechanism=mechanism,
            quorum=quorum,
            disclosure=disclosure,
        )

    def release(self, round_id: int) -> None:
        self.sql.release(round_id, actor=self.actor)

    def commit(
        self,
        round_id: int,
        actual: Mapping[str, DpEvent],
        *,
        outcome: Mapping[str, object] | None = None,
    ) -> None:
        self.sql.commit(round_id, actual, actor=self.actor, outcome=outcome)

    def commit_at_reservation(self, round_id: int) -> None:
        self.sql.commit_at_reservation(round_id, actor=self.actor)

    def abort(self, round_id: int, *, reason: str) -> None:
        self.sql.abort(round_id, actor=self.actor, reason=reason)

    def round_state(self, round_id: int) -> RoundState:
        return self.sql.round_state(round_id)

    def round_record(self, round_id: int, party: str | None = None) -> RoundRecord | None:
        """The round; with ``party``'s row only when given."""
        return self.sql.round_held(round_id, party)

    def record(
        self, actor: str, action: str, detail: Mapping[str, object], note: str | None = None
    ) -> None:
        self.sql.record(actor, action, dict(detail), note=note)


__all__ = ["SqlRoundLedger"]
