"""Reading a ledger: budgets, spends, rounds, entries and history (no writes).

The reads a round needs (a party's budget and spend, a round's record, the
open rounds) are single Core statements; each opens one connection.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import Session

from capc.privacy.events import DpEvent
from capc.round.errors import RoundStateError, UnknownPartyError
from capc.round.ledger import Held, RoundRecord, RoundState
from services.common.db import iso_utc
from services.common.ledger.base import FloatArray, LedgerBase, registered_cap
from services.common.ledger.models import ChargeKind, ChargeRow, RoundRow, TrainingRow
from services.common.ledger.prepared import Prepared
from services.common.ledger.records import LedgerEntry, PartyBudget, RoundCharges
from services.common.ledger.tables import (
    CAPS,
    CHARGES,
    HELD,
    HELD_OF,
    LAST_ROUND,
    OPEN_ROUNDS,
    ROUND,
    ROUND_STATE,
    SPEND_LOSS,
    UNSETTLED,
    parties,
    rounds,
    spend,
)

_BUDGETS = (
    select(
        parties.c.name,
        parties.c.role,
        parties.c.status,
        parties.c.epsilon_cap,
        spend.c.loss,
        spend.c.rounds,
        parties.c.last_seen,
        parties.c.registered_cap,
        parties.c.declared_cap,
        parties.c.report,
        parties.c.registered_teachers,
        spend.c.rounds_asked,
    )
    .join(spend, spend.c.party == parties.c.name)
    .order_by(parties.c.name)
)
_BUDGET = Prepared(_BUDGETS.where(parties.c.name == bindparam("party")))


class Reads(LedgerBase):
    """What a ledger shows: budgets, spends, rounds and their entries."""

    def _budgets(self, conn: Connection, name: str | None) -> list[PartyBudget]:
        rows: Sequence[Sequence[Any]] = (
            list(conn.execute(_BUDGETS)) if name is None else _BUDGET.rows(conn, {"party": name})
        )
        out = []
        for row in rows:
            (who, role, status, cap, loss, n, seen, registered, declared, report, pinned,
             asked) = row  # fmt: skip
            eps, order = self._eps(loss)
            out.append(
                PartyBudget(
                    who,
                    role,
                    status,
                    cap,
                    eps,
                    max(0.0, cap - eps),
                    order,
                    n,
                    seen,
                    registered_cap(cap, registered),
                    declared,
                    report,
                    pinned,
                    asked,
                )
            )
        return out

    def budgets(self) -> list[PartyBudget]:
        """Every party's cap, spend and remaining epsilon (reservations count as spent)."""
        with self.engine.connect() as conn:
            return self._budgets(conn, None)

    def caps(self, role: str = "answerer") -> dict[str, float]:
        """Every ``role`` party's enforced cap (epsilon at the ledger's delta), by name: what
        :meth:`budgets` shows of them without working out each one's spend."""
        with self.engine.connect() as conn:
            return {str(n): float(c) for n, c in CAPS.rows(conn, {"role": role})}

    def budget(self, name: str) -> PartyBudget:
        """Party ``name``'s cap, spend and remaining epsilon."""
        with self.engine.connect() as conn:
            found = self._budgets(conn, name)
        if not found:
            raise UnknownPartyError(f"no party named {name!r}")
        return found[0]

    def spent_loss(self, name: str) -> FloatArray:
        """A party's loss vector (charges and open reservations) in the ledger's accountant."""
        with self.engine.connect() as conn:
            loss = SPEND_LOSS.scalar(conn, {"party": name})
        if loss is None:
            raise UnknownPartyError(f"no party named {name!r}")
        return np.asarray(loss, dtype=np.float64)

    def queries_fit(self, per_query: DpEvent, epsilon: float, party: str | None = None) -> int:
        """How many more queries costing ``per_query`` each fit ``epsilon`` at the ledger's delta,
        after what ``party`` (if given) has spent and reserved; what this ledger admits."""
        self._loss(per_query, "per-query cost")
        spent = None if party is None else self.spent_loss(party)
        return self.accounting.max_count(per_query, epsilon, self.delta, spent)

    def settled_loss(self, name: str, through: int) -> FloatArray:
        """What the ledger counts for ``name`` from every round up to ``through`` that is
        settled: its running total less every open reservation and every charge of a later
        round. Two ledgers that saw the same rounds agree on it to float rounding, and a
        running total altered in the database shows up here."""
        with self.engine.connect() as conn:
            return _settled_loss(conn, name, through)

    def spend_report(self, name: str) -> tuple[list[int], int, FloatArray, PartyBudget]:
        """What party ``name`` reports of its own ledger, read on one connection: the open
        rounds (oldest first), the round ``through`` which every round is settled (the one
        before the oldest open round, else the last; 0 for none), its settled loss through
        it (:meth:`settled_loss`) and its budget (:meth:`budget`)."""
        with self.engine.connect() as conn:
            opened = [int(i) for i in OPEN_ROUNDS.scalars(conn)]
            through = max(0, opened[0] - 1 if opened else int(LAST_ROUND.scalar(conn) or 0))
            found = self._budgets(conn, name)
            if not found:
                raise UnknownPartyError(f"no party named {name!r}")
            return opened, through, _settled_loss(conn, name, through), found[0]

    def round_charges(self, round_id: int) -> RoundCharges | None:
        """A round with its terms, outcome and per-party rows; None if there is none."""
        with self.engine.connect() as conn:
            rnd = ROUND.first(conn, {"rid": round_id})
            if rnd is None:
                return None
            rows = CHARGES.rows(conn, {"rid": round_id})
            held = {p: (ChargeKind(kind), event) for p, kind, _, event in rows}
        return RoundCharges(round_id, RoundState(rnd[0]), rnd[1], rnd[2], held)

    def round_held(self, round_id: int, party: str | None = None) -> RoundRecord | None:
        """What a settlement reads of a round (:meth:`round_charges` without decoding its
        events), with ``party``'s row only when given (one party's settlement of a round
        of hundreds); None if there is none."""
        with self.engine.connect() as conn:
            rnd = ROUND.first(conn, {"rid": round_id})
            if rnd is None:
                return None
            if party is None:
                rows = HELD.rows(conn, {"rid": round_id})
            else:
                rows = HELD_OF.rows(conn, {"rid": round_id, "party": party})
            held = {p: Held(kind == ChargeKind.CHARGE, bool(event)) for p, kind, event in rows}
        return RoundRecord(round_id, RoundState(rnd[0]), rnd[2], held, rnd[1])

    def open_rounds(self) -> list[int]:
        """Ids of rounds reserved or released but not yet committed or aborted, oldest first."""
        with self.engine.connect() as conn:
            return [int(i) for i in OPEN_ROUNDS.scalars(conn)]

    def last_round(self) -> int:
        """The highest round id, 0 when there is none."""
        with self.engine.connect() as conn:
            return int(LAST_ROUND.scalar(conn) or 0)

    def round_state(self, round_id: int) -> RoundState:
        with self.engine.connect() as conn:
            state = ROUND_STATE.scalar(conn, {"rid": round_id})
        if state is None:
            raise RoundStateError(f"no round {round_id}")
        return RoundState(state)

    def count_rounds(self, state: RoundState | None = None) -> int:
        q = select(func.count(rounds.c.id))
        if state is not None:
            q = q.where(rounds.c.state == state)
        with self.engine.connect() as conn:
            return int(conn.scalar(q) or 0)

    def entries(
        self,
        *,
        party: str | None = None,
        round_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[LedgerEntry]:
        """Charges and reservations, newest first, with epsilon of each entry alone."""
        q = select(ChargeRow, RoundRow).join(RoundRow, RoundRow.id == ChargeRow.round_id)
        if party is not None:
            q = q.where(ChargeRow.party == party)
        if round_id is not None:
            q = q.where(ChargeRow.round_id == round_id)
        q = q.order_by(ChargeRow.id.desc()).limit(limit).offset(offset)
        with Session(self.engine) as s:
            return [
                LedgerEntry(
                    round_id=c.round_id,
                    party=c.party,
                    kind=c.kind.value,
                    mechanism=c.mechanism,
                    round_state=r.state.value,
                    task=r.task,
                    queries=r.queries,
                    epsilon_alone=self._eps(c.loss)[0],
                    at=iso_utc(c.created_at),
                )
                for c, r in s.execute(q)
            ]

    def history(
        self, party: str | None = None, max_points: int = 500
    ) -> dict[str, list[tuple[str, float, int]]]:
        """Per party: (time, epsilon at the ledger's delta, round id) after each entry that
        still counts, oldest first. Reservations count until their round commits or aborts,
        as they do in :meth:`budgets`, so the curve never lies below the true spend.

        At most ``max_points`` per party: earlier points are thinned evenly, the newest kept.
        """
        q = select(ChargeRow.party, ChargeRow.loss, ChargeRow.created_at, ChargeRow.round_id)
        # DP-SGD trainings (charged once each) are entries too, at round id 0.
        t = select(TrainingRow.party, TrainingRow.loss, TrainingRow.created_at)
        if party is not None:
            q = q.where(ChargeRow.party == party)
            t = t.where(TrainingRow.party == party)
        with Session(self.engine) as s:
            rows = list(s.execute(q.order_by(ChargeRow.id)))
            trained = list(s.execute(t.order_by(TrainingRow.id)))
        by_party: dict[str, list[tuple[list[float], dt.datetime, int]]] = {}
        for name, loss, at in trained:
            by_party.setdefault(name, []).append((loss, at, 0))
        for name, loss, at, round_id in rows:
            by_party.setdefault(name, []).append((loss, at, round_id))
        for items in by_party.values():
            # In time order (stable: charges keep their order among themselves). SQLite
            # gives naive times and PostgreSQL aware ones; both are UTC.
            items.sort(key=lambda item: _utc(item[1]))
        out: dict[str, list[tuple[str, float, int]]] = {}
        for name, items in by_party.items():
            # The accountants are additive: composition is a running sum of loss vectors.
            total = np.cumsum(np.asarray([r for r, _, _ in items], dtype=np.float64), axis=0)
            keep = np.unique(
                np.linspace(0, len(items) - 1, min(len(items), max(1, max_points))).round()
            ).astype(int)
            out[name] = [
                (iso_utc(items[i][1]), self._eps(np.maximum(total[i], 0.0))[0], items[i][2])
                for i in keep
            ]
        return out

    # -- empirical audits -----------------------------------------------------


def _utc(at: dt.datetime) -> dt.datetime:
    """``at`` as a naive UTC time (SQLite stores naive UTC, PostgreSQL gives aware times)."""
    return at if at.tzinfo is None else at.astimezone(dt.UTC).replace(tzinfo=None)


def _settled_loss(conn: Connection, name: str, through: int) -> FloatArray:
    """:meth:`Reads.settled_loss` on ``conn``."""
    loss = SPEND_LOSS.scalar(conn, {"party": name})
    if loss is None:
        raise UnknownPartyError(f"no party named {name!r}")
    total = np.asarray(loss, dtype=np.float64)
    for held in UNSETTLED.scalars(conn, {"party": name, "through": through}):
        total = total - np.asarray(held, dtype=np.float64)
    return np.maximum(total, 0.0)
