"""The ledger's tables as SQLAlchemy Core objects, and the statements a round runs.

The ORM classes in :mod:`services.common.ledger.models` define the schema (the
migrations create exactly it); the write path and the reads a round needs run
Core statements on these tables instead, so a round costs a few statements
and no unit of work, identity map or per-row object. The statements are built
once, here, with bound parameters. Those a round runs are :class:`Prepared`:
compiled once per dialect and run on the driver's cursor, without SQLAlchemy's
per-statement execution context (most of a short statement's CPU); a statement
with an expanding ``IN`` list (a round's hundreds of parties, one statement a
step) runs through ``Connection.execute``, and has a one-party form that is
prepared (a hospital's own ledger: one party, every round).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import (
    BindParameter,
    Column,
    ColumnElement,
    Connection,
    Select,
    Table,
    Text,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast

from capc.round.ledger import RoundState
from services.common.ledger import models
from services.common.ledger.prepared import Prepared

settings = cast(Table, models.Setting.__table__)
parties = cast(Table, models.PartyRow.__table__)
spend = cast(Table, models.SpendRow.__table__)
tasks = cast(Table, models.TaskRow.__table__)
rounds = cast(Table, models.RoundRow.__table__)
charges = cast(Table, models.ChargeRow.__table__)
audit_log = cast(Table, models.AuditRow.__table__)
allowances = cast(Table, models.AllowanceRow.__table__)
querier_spend = cast(Table, models.QuerierSpendRow.__table__)

FloatArray = NDArray[np.float64]


def _values(table: Table, *names: str) -> dict[Column[object], object]:
    """An INSERT's values: a bind of each column's own name and type. Every column with
    a default is named (a :class:`Prepared` statement fills no defaults)."""
    return {table.c[n]: bindparam(n, type_=table.c[n].type) for n in names}


# -- settings ------------------------------------------------------------------
_SETTING = select(settings.c.value).where(settings.c.key == bindparam("key"))
SETTING = Prepared(_SETTING)
SETTING_LOCKED = Prepared(_SETTING.with_for_update())
INSERT_SETTING = insert(settings)
_UPDATE_SETTING = (
    update(settings).where(settings.c.key == bindparam("b_key")).values(value=bindparam("b_value"))
)
UPDATE_SETTING = Prepared(_UPDATE_SETTING)
#: A setting's new value where it has another one (its row count says whether it did).
UPDATE_SETTING_CHANGED = Prepared(_UPDATE_SETTING.where(settings.c.value != bindparam("b_value")))

# -- parties -------------------------------------------------------------------
#: (name, enforced cap) of every party of a role, in name order (as budgets list them).
CAPS = Prepared(
    select(parties.c.name, parties.c.epsilon_cap)
    .where(parties.c.role == bindparam("role"))
    .order_by(parties.c.name)
)
#: A party seen now (a heartbeat, a connection): one statement, no unit of work.
TOUCH_PARTY = Prepared(
    update(parties)
    .where(parties.c.name == bindparam("b_name"))
    .values(last_seen=bindparam("b_at", type_=parties.c.last_seen.type))
)
#: A party's latest report of its own ledger (JSON).
SET_PARTY_REPORT = Prepared(
    update(parties)
    .where(parties.c.name == bindparam("b_name"))
    .values(report=bindparam("b_report", type_=parties.c.report.type))
)

# -- rounds ----------------------------------------------------------------------
#: (round key or id used before, task known, the querier's allowance or None) for a
#: new round: one statement.
OPENABLE = Prepared(
    select(
        exists(
            select(rounds.c.id).where(
                or_(rounds.c.round_key == bindparam("key"), rounds.c.id == bindparam("rid"))
            )
        ),
        exists(select(tasks.c.name).where(tasks.c.name == bindparam("task"))),
        select(allowances.c.epsilon_cap)
        .where(allowances.c.querier == bindparam("querier"))
        .scalar_subquery(),
    )
)
ROUND_LOCKED = Prepared(
    select(rounds.c.state, rounds.c.querier)
    .where(rounds.c.id == bindparam("rid"))
    .with_for_update()
)
#: A round's (state, querier) with each of its rows (party, loss, event; None, None, None
#: for a round with none), in party order: only the round's row is locked (``FOR UPDATE
#: OF``). Its charge rows are read as the statement began, which is how they stand: every
#: transaction that changes them locks the round's row first, and the changes of one that
#: this lock waited for leave the round committed or aborted, which a settlement refuses.
ROUND_CHARGES_LOCKED = Prepared(
    select(rounds.c.state, rounds.c.querier, charges.c.party, charges.c.loss, charges.c.event)
    .select_from(rounds.outerjoin(charges, charges.c.round_id == rounds.c.id))
    .where(rounds.c.id == bindparam("rid"))
    .order_by(charges.c.party)
    .with_for_update(of=rounds)
)
ROUND = Prepared(
    select(rounds.c.state, rounds.c.terms, rounds.c.outcome).where(rounds.c.id == bindparam("rid"))
)
ROUND_STATE = Prepared(select(rounds.c.state).where(rounds.c.id == bindparam("rid")))
#: Rounds reserved or released (two comparisons: a literal IN list would expand).
OPEN_ROUNDS = Prepared(
    select(rounds.c.id)
    .where(
        or_(
            rounds.c.state == RoundState.RESERVED,
            rounds.c.state == RoundState.RELEASED,
        )
    )
    .order_by(rounds.c.id)
)
LAST_ROUND = Prepared(select(func.max(rounds.c.id)))
#: A new round numbered by the database (the guardian's: its id comes back).
INSERT_ROUND = insert(rounds)
#: A new round numbered by the caller (a party's own ledger: the guardian's round id).
INSERT_NUMBERED_ROUND = Prepared(
    insert(rounds).values(
        _values(rounds, "id", "round_key", "task", "querier", "queries", "state", "terms")
        | _values(rounds, "created_at", "updated_at")
    )
)
_SET_ROUND_STATE = (
    update(rounds)
    .where(rounds.c.id == bindparam("b_rid"))
    .values(
        state=bindparam("b_state", type_=rounds.c.state.type),
        updated_at=bindparam("b_at", type_=rounds.c.updated_at.type),
    )
)
SET_ROUND_STATE = Prepared(_SET_ROUND_STATE)
#: A round's state with what it released.
SET_ROUND_OUTCOME = Prepared(
    _SET_ROUND_STATE.values(outcome=bindparam("b_outcome", type_=rounds.c.outcome.type))
)

# -- charges ---------------------------------------------------------------------
CHARGES = Prepared(
    select(charges.c.party, charges.c.kind, charges.c.loss, charges.c.event).where(
        charges.c.round_id == bindparam("rid")
    )
)
#: Per party of a round: the kind of row held and whether it holds an event, without
#: decoding the events (a settlement needs no more, and a round of 200 parties is 200).
#: A charge of nothing (a party that dropped out) is stored as JSON null, not SQL NULL
#: (the JSON type's default): both mean no event.
_HELD = select(
    charges.c.party,
    charges.c.kind,
    and_(charges.c.event.is_not(None), sql_cast(charges.c.event, Text) != "null"),
).where(charges.c.round_id == bindparam("rid"))
HELD = Prepared(_HELD)
#: :data:`HELD` of one party.
HELD_OF = Prepared(_HELD.where(charges.c.party == bindparam("party")))
INSERT_CHARGES = Prepared(
    insert(charges).values(
        _values(charges, "round_id", "party", "kind", "mechanism", "loss", "event", "created_at")
    )
)
DELETE_CHARGES = Prepared(delete(charges).where(charges.c.round_id == bindparam("rid")))
UPDATE_CHARGES = Prepared(
    update(charges)
    .where(charges.c.round_id == bindparam("b_rid"), charges.c.party == bindparam("b_party"))
    .values(
        kind=bindparam("b_kind", type_=charges.c.kind.type),
        loss=bindparam("b_loss", type_=charges.c.loss.type),
        event=bindparam("b_event", type_=charges.c.event.type),
    )
)
#: A party's open reservations and charges of rounds after ``through``.
UNSETTLED = Prepared(
    select(charges.c.loss).where(
        charges.c.party == bindparam("party"),
        or_(
            charges.c.kind == models.ChargeKind.RESERVATION,
            charges.c.round_id > bindparam("through"),
        ),
    )
)

# -- spends ----------------------------------------------------------------------
SPEND_LOSS = Prepared(select(spend.c.loss).where(spend.c.party == bindparam("party")))
_SPENDS = select(spend.c.party, spend.c.loss, spend.c.rounds, spend.c.rounds_asked)
#: The parties a spend statement reads: a list (run by ``Connection.execute``), or one
#: (prepared: a hospital's own ledger).
_NAMES: BindParameter[Any] = bindparam("names", expanding=True)
_NAME: BindParameter[Any] = bindparam("name")


def _spends_caps_locked(party: ColumnElement[bool]) -> Select[Any]:
    return (
        _SPENDS.add_columns(parties.c.epsilon_cap, parties.c.status)
        .join(parties, parties.c.name == spend.c.party)
        .where(party)
        .order_by(spend.c.party)
        .with_for_update(of=spend)
    )


#: Spend rows locked (only those: ``FOR UPDATE OF``) with their parties' cap and status.
SPENDS_CAPS_LOCKED = _spends_caps_locked(spend.c.party.in_(_NAMES))
SPENDS_CAPS_LOCKED_OF = Prepared(_spends_caps_locked(spend.c.party == _NAME))


def _limits(party: ColumnElement[bool]) -> Select[Any]:
    return select(
        parties.c.name,
        parties.c.epsilon_cap,
        parties.c.status,
        select(allowances.c.epsilon_cap)
        .where(allowances.c.querier == bindparam("querier"))
        .scalar_subquery(),
    ).where(party)


#: Each party's (name, enforced cap, status) with the querier's allowance (None for
#: none), read by a reservation once its spend rows are locked (PostgreSQL): the caps
#: that :data:`SPENDS_CAPS_LOCKED` joins are its statement's snapshot, which a cap or
#: allowance cut committed while the lock waited leaves stale.
LIMITS = _limits(parties.c.name.in_(_NAMES))
LIMITS_OF = Prepared(_limits(parties.c.name == _NAME))


def _spends_shares(party: ColumnElement[bool]) -> Select[Any]:
    return (
        _SPENDS.add_columns(parties.c.epsilon_cap, parties.c.status, querier_spend.c.loss)
        .join(parties, parties.c.name == spend.c.party)
        .outerjoin(
            querier_spend,
            and_(
                querier_spend.c.party == spend.c.party,
                querier_spend.c.querier == bindparam("querier"),
            ),
        )
        .where(party)
        .order_by(spend.c.party)
    )


#: What a reservation or settlement reads of its parties in one statement where the
#: whole database is locked (SQLite): spend rows (with caps and status) and the querier's
#: loss on each (None where it has none).
_SPENDS_SHARES = _spends_shares(spend.c.party.in_(_NAMES))
_SPENDS_SHARES_OF = Prepared(_spends_shares(spend.c.party == _NAME))
UPDATE_SPENDS = Prepared(
    update(spend)
    .where(spend.c.party == bindparam("b_party"))
    .values(
        loss=bindparam("b_loss", type_=spend.c.loss.type),
        rounds=bindparam("b_rounds", type_=spend.c.rounds.type),
        rounds_asked=bindparam("b_asked", type_=spend.c.rounds_asked.type),
    )
)


def _querier_spends_locked(party: ColumnElement[bool]) -> Select[Any]:
    return (
        select(querier_spend.c.party, querier_spend.c.loss)
        .where(querier_spend.c.querier == bindparam("querier"), party)
        .order_by(querier_spend.c.party)
        .with_for_update()
    )


QUERIER_SPENDS_LOCKED = _querier_spends_locked(querier_spend.c.party.in_(_NAMES))
QUERIER_SPENDS_LOCKED_OF = Prepared(_querier_spends_locked(querier_spend.c.party == _NAME))
INSERT_QUERIER_SPENDS = Prepared(
    insert(querier_spend).values(_values(querier_spend, "querier", "party", "loss"))
)
UPDATE_QUERIER_SPENDS = Prepared(
    update(querier_spend)
    .where(
        querier_spend.c.querier == bindparam("b_querier"),
        querier_spend.c.party == bindparam("b_party"),
    )
    .values(loss=bindparam("b_loss", type_=querier_spend.c.loss.type))
)

# -- audit log -------------------------------------------------------------------
INSERT_AUDIT = Prepared(
    insert(audit_log).values(
        _values(audit_log, "seq", "at", "actor", "action", "detail", "prev_hash", "hash")
        | _values(audit_log, "note", "signature")
    )
)


@dataclass
class Spend:
    """A party's running totals, read under its row lock and written back once, with its
    enforced cap (epsilon) and status as read with them."""

    loss: FloatArray
    rounds: int
    rounds_asked: int
    cap: float
    status: str


def lock_spends(
    conn: Connection, querier: str, names: Sequence[str]
) -> tuple[dict[str, Spend], dict[str, FloatArray]]:
    """The spend rows of ``names`` (parties known to the ledger only), locked for this
    transaction in a fixed order (no deadlocks), and ``querier``'s loss vector on each
    of them that has one.

    On SQLite one statement: every transaction there holds the database's write lock
    from its BEGIN (IMMEDIATE), so what it reads is current. Elsewhere (PostgreSQL, READ
    COMMITTED) two: a row joined to a locked row is read as the statement's snapshot had
    it, which a writer the lock waited for may have changed since, so the querier's rows
    are locked and read by a statement of their own once the spend rows are locked
    (every writer of a querier's row on a party locks the party's spend row first)."""
    names = list(names)
    one = {"name": names[0], "querier": querier} if len(names) == 1 else None
    rows: Sequence[Sequence[Any]]
    if conn.dialect.name == "sqlite":
        if one is not None:
            rows = _SPENDS_SHARES_OF.rows(conn, one)
        else:
            rows = list(conn.execute(_SPENDS_SHARES, {"names": names, "querier": querier}))
        shares = {r[0]: np.asarray(r[6], dtype=np.float64) for r in rows if r[6] is not None}
    else:
        if one is not None:
            rows = SPENDS_CAPS_LOCKED_OF.rows(conn, one)
            found = QUERIER_SPENDS_LOCKED_OF.rows(conn, one)
        else:
            rows = list(conn.execute(SPENDS_CAPS_LOCKED, {"names": names}))
            found = [
                tuple(r)
                for r in conn.execute(QUERIER_SPENDS_LOCKED, {"querier": querier, "names": names})
            ]
        shares = {p: np.asarray(loss, dtype=np.float64) for p, loss in found}
    spends = {
        r[0]: Spend(
            np.asarray(r[1], dtype=np.float64), int(r[2]), int(r[3]), float(r[4]), str(r[5])
        )
        for r in rows
    }
    return spends, shares


def write_spends(conn: Connection, spends: dict[str, Spend], names: Sequence[str]) -> None:
    """Write back the spend rows of ``names`` (one statement, executed for each)."""
    if names:
        UPDATE_SPENDS.run_many(
            conn,
            [
                {
                    "b_party": p,
                    "b_loss": spends[p].loss.tolist(),
                    "b_rounds": spends[p].rounds,
                    "b_asked": spends[p].rounds_asked,
                }
                for p in names
            ],
        )


def write_querier_spends(
    conn: Connection, querier: str, shares: dict[str, FloatArray], names: Sequence[str]
) -> None:
    """Write back the querier's loss vectors on ``names`` (rows that exist)."""
    if names:
        UPDATE_QUERIER_SPENDS.run_many(
            conn,
            [{"b_querier": querier, "b_party": p, "b_loss": shares[p].tolist()} for p in names],
        )
