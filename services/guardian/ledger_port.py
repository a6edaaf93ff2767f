"""The guardian's SQL ledger behind the round core's ledger port (:class:`capc.round.RoundLedger`).

Only calls the ledger's public methods; each is one transaction there. Its
refusals come out as the core's (:class:`capc.round.QuorumError`,
:class:`capc.round.RoundStateError`) while staying the ledger's own classes
too, so callers that catch ``services.common.ledger.QuorumError`` still do.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from capc.privacy.accountants import Accounting
from capc.privacy.events import DpEvent
from capc.round import errors as core
from capc.round.ledger import Held, Reservation, RoundRecord, RoundState
from services.common.ledger import Ledger
from services.common.ledger import store as sql
from services.common.ledger.models import ChargeKind


class QuorumError(sql.QuorumError, core.QuorumError):
    """Too few parties can afford the round (both the ledger's and the core's error)."""

    def __init__(self, message: str, remaining: Mapping[str, float]) -> None:
        Exception.__init__(self, message)
        self.remaining = dict(remaining)


class RoundStateError(sql.RoundStateError, core.RoundStateError):
    """The round's state forbids the transition (both the ledger's and the core's error)."""


@contextmanager
def _as_core() -> Iterator[None]:
    try:
        yield
    except sql.QuorumError as err:
        raise QuorumError(str(err), err.remaining) from None
    except sql.RoundStateError as err:
        raise RoundStateError(str(err)) from None


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
        with _as_core():
            r = self.sql.reserve(
                round_key,
                task,
                querier,
                queries,
                worst_case,
                mechanism=mechanism,
                quorum=quorum,
                disclosure=disclosure,
            )
        return Reservation(r.round_id, r.included, dict(r.excluded))

    def release(self, round_id: int) -> None:
        with _as_core():
            self.sql.release(round_id, actor=self.actor)

    def commit(
        self,
        round_id: int,
        actual: Mapping[str, DpEvent],
        *,
        outcome: Mapping[str, object] | None = None,
    ) -> None:
        with _as_core():
            self.sql.commit(round_id, actual, actor=self.actor, outcome=outcome)

    def commit_at_reservation(self, round_id: int) -> None:
        with _as_core():
            self.sql.commit_at_reservation(round_id, actor=self.actor)

    def abort(self, round_id: int, *, reason: str) -> None:
        with _as_core():
            self.sql.abort(round_id, actor=self.actor, reason=reason)

    def round_state(self, round_id: int) -> RoundState:
        with _as_core():
            return RoundState(self.sql.round_state(round_id).value)

    def round_record(self, round_id: int, party: str | None = None) -> RoundRecord | None:
        """The round; with ``party``'s row only when given."""
        record = self.sql.round_held(round_id, party)
        if record is None:
            return None
        held = {
            p: Held(kind == ChargeKind.CHARGE, event) for p, (kind, event) in record.held.items()
        }
        return RoundRecord(record.round_id, RoundState(record.state.value), record.outcome, held)

    def record(
        self, actor: str, action: str, detail: Mapping[str, object], note: str | None = None
    ) -> None:
        self.sql.record(actor, action, dict(detail), note=note)


__all__ = ["QuorumError", "RoundStateError", "SqlRoundLedger"]
