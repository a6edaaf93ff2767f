"""The guardian's held reports and heartbeats (services/guardian/notes.py): written in one
transaction, the newest of each party kept, and kept again when a write fails."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from services.common.ledger import Ledger
from services.guardian.notes import PartyNotes


def _ledger(url: str) -> Ledger:
    db = Ledger(url)
    for name in ("h1", "h2"):
        db.register_party(name, 10.0)
    return db


def test_notes_are_written_together_and_the_newest_report_wins(ledger_url: str) -> None:
    db = _ledger(ledger_url)
    notes = PartyNotes(db)
    notes.report("h1", {"through": 1, "settled": [0.1]})
    notes.report("h1", {"through": 2, "settled": [0.2]})
    notes.seen("h2")
    assert {b.name: b.report for b in db.budgets()} == {"h1": None, "h2": None}
    commits: list[int] = []
    event.listen(db.engine, "commit", lambda conn: commits.append(1))
    notes.flush()
    assert len(commits) == 1
    budgets = {b.name: b for b in db.budgets()}
    report = budgets["h1"].report
    assert report is not None and report["through"] == 2 and report["settled"] == [0.2]
    assert "received_at" in report
    assert budgets["h2"].last_seen is not None and budgets["h1"].last_seen is None
    notes.flush()  # nothing held: no transaction
    assert len(commits) == 1
    db.close()


def test_notes_a_write_failed_to_keep_are_written_next_time(ledger_url: str) -> None:
    db = _ledger(ledger_url)
    notes = PartyNotes(db)
    notes.report("h1", {"through": 1, "settled": [0.1]})
    notes.seen("h1")
    fail = [True]

    @event.listens_for(db.engine, "before_cursor_execute")
    def _once(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if fail[0] and statement.lstrip().upper().startswith("UPDATE PARTIES"):
            fail[0] = False
            raise OperationalError(statement, None, Exception("database is locked"))

    with pytest.raises(OperationalError):
        notes.flush()
    assert db.budget("h1").report is None
    notes.report("h2", {"through": 3, "settled": [0.3]})
    notes.flush()
    budgets = {b.name: b for b in db.budgets()}
    assert budgets["h1"].report is not None and budgets["h1"].last_seen is not None
    assert budgets["h2"].report is not None
    db.close()
