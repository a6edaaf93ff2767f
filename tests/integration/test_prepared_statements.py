"""Prepared ledger statements (services/common/ledger/prepared.py) against SQLAlchemy's own
execution, on SQLite and PostgreSQL: the same rows stored and read back, the engine's
cursor listeners called, SQLAlchemy's exceptions raised, and statements that a driver
cannot run as compiled refused."""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

import pytest
from sqlalchemy import bindparam, event, insert, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.sql.expression import Executable

from capc.round.ledger import RoundState
from services.common.ledger import Ledger
from services.common.ledger.models import ChargeKind
from services.common.ledger.prepared import Prepared
from services.common.ledger.tables import (
    CHARGES,
    INSERT_CHARGES,
    INSERT_NUMBERED_ROUND,
    INSERT_ROUND,
    ROUND,
    charges,
    rounds,
)

NOW = dt.datetime(2026, 11, 27, 12, 0, 0, 123456, tzinfo=dt.UTC)


def _ledger(url: str) -> Ledger:
    db = Ledger(url)
    db.register_party("h1", 10.0)
    db.create_task("t", {"name": "t"})
    return db


def _round(rid: int, terms: dict[str, object] | None) -> dict[str, object]:
    return {
        "round_key": f"k{rid}",
        "task": "t",
        "querier": "q",
        "queries": 4,
        "state": RoundState.RESERVED,
        "terms": terms,
        "created_at": NOW,
        "updated_at": NOW,
    }


def _charge(rid: int, event_: dict[str, object] | None) -> dict[str, object]:
    return {
        "round_id": rid,
        "party": "h1",
        "kind": ChargeKind.RESERVATION,
        "mechanism": "gnmax",
        "loss": [0.5, 1.0],
        "event": event_,
        "created_at": NOW,
    }


def test_a_prepared_write_stores_what_connection_execute_stores(ledger_url: str) -> None:
    """Two rounds and their charges, one written each way (JSON null, enum, times):
    the database holds the same values, and each way reads them back alike."""
    db = _ledger(ledger_url)
    with db.engine.begin() as conn:
        conn.execute(INSERT_ROUND, {**_round(1, None), "id": 1})
        conn.execute(insert(charges), _charge(1, None))
        INSERT_NUMBERED_ROUND.run(conn, {**_round(2, None), "id": 2})
        INSERT_CHARGES.run_many(conn, [_charge(2, None)])
    with db.engine.connect() as conn:
        # As the database holds them, as text: the same for both rounds.
        stored = [
            tuple(
                conn.exec_driver_sql(
                    "SELECT r.state, CAST(r.terms AS TEXT), CAST(r.created_at AS TEXT), "
                    "c.kind, CAST(c.loss AS TEXT), CAST(c.event AS TEXT), "
                    "CAST(c.created_at AS TEXT) FROM rounds r JOIN charges c "
                    f"ON c.round_id = r.id WHERE r.id = {rid}"
                ).one()
            )
            for rid in (1, 2)
        ]
        assert stored[0] == stored[1]
        assert stored[0][0] == "RESERVED" and stored[0][5] == "null"
        for rid in (1, 2):
            mine = ROUND.first(conn, {"rid": rid})
            theirs = conn.execute(cast(Executable, ROUND.statement), {"rid": rid}).one()
            assert mine == tuple(theirs)
            assert mine is not None and mine[0] is RoundState.RESERVED
            assert CHARGES.rows(conn, {"rid": rid}) == [
                tuple(r) for r in conn.execute(cast(Executable, CHARGES.statement), {"rid": rid})
            ]
        assert CHARGES.rows(conn, {"rid": 2}) == [("h1", ChargeKind.RESERVATION, [0.5, 1.0], None)]
    db.close()


def test_the_engines_cursor_listeners_see_prepared_statements(ledger_url: str) -> None:
    """A listener before a statement may fail it (as the crash tests inject failures),
    and one after it sees it run; the failure is SQLAlchemy's exception."""
    db = _ledger(ledger_url)
    seen: list[str] = []

    @event.listens_for(db.engine, "before_cursor_execute")
    def _before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO CHARGES"):
            raise OperationalError(statement, None, Exception("disk I/O error"))

    @event.listens_for(db.engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement.split()[0].upper())

    with pytest.raises(OperationalError), db.engine.begin() as conn:
        INSERT_NUMBERED_ROUND.run(conn, {**_round(1, None), "id": 1})
        INSERT_CHARGES.run_many(conn, [_charge(1, None)])
    assert seen == ["INSERT"]
    # Rolled back with its transaction.
    with db.engine.connect() as conn:
        assert ROUND.first(conn, {"rid": 1}) is None
    db.close()


def test_a_driver_error_is_sqlalchemys_and_a_read_begins_a_transaction(ledger_url: str) -> None:
    db = _ledger(ledger_url)
    with db.engine.begin() as conn:
        INSERT_NUMBERED_ROUND.run(conn, {**_round(1, {"a": 1}), "id": 1})
    with pytest.raises(IntegrityError), db.engine.begin() as conn:
        INSERT_NUMBERED_ROUND.run(conn, {**_round(1, None), "round_key": "other", "id": 1})
    with db.engine.connect() as conn:
        assert not conn.in_transaction()
        assert ROUND.first(conn, {"rid": 1}) == (RoundState.RESERVED, {"a": 1}, None)
        assert conn.in_transaction()  # as Connection.execute would have begun one
    db.close()


def test_statements_a_driver_cannot_run_as_compiled_are_refused(ledger_url: str) -> None:
    """An expanding IN list, and a column SQLAlchemy would fill from its Python default
    (a driver would store NULL for it): refused when first run, nothing written."""
    db = _ledger(ledger_url)
    listed = Prepared(select(rounds.c.id).where(rounds.c.id.in_(bindparam("ids", expanding=True))))
    defaulted = Prepared(insert(charges).values(round_id=bindparam("round_id")))
    with db.engine.connect() as conn:
        with pytest.raises(TypeError, match="expanding"):
            listed.rows(conn, {"ids": [1]})
        with pytest.raises(TypeError, match="created_at"):
            defaulted.run(conn, {"round_id": 1})
    db.close()
