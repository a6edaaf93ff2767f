"""Attacks on the leaner own-ledger path (batches without savepoints, one-statement
spend reads, BEGIN IMMEDIATE in the SQLite dialect) on real SQLite files and the
real PostgreSQL server.

Each test fails if a limit lowered before a reservation took its locks could be read
stale by it (PostgreSQL, READ COMMITTED), if a broken batch could commit part of
itself, or if a refused step could leave a write or an audit entry behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text

from capc.mechanisms.registry import from_config
from services.common.ledger import Ledger, QuorumError

PARTY = "hospital-a"
QUERIER = "student"
TASK = "t"
CONFIG: dict[str, Any] = {
    "num_classes": 10,
    "input_shape": [4],
    "mechanism": {"name": "robust-confident-gnmax", "sigma": 1.5, "threshold": 3.5, "sigma1": 2.0},
    "quorum": 1,
}
BATCH = 8
MECH = from_config(CONFIG["mechanism"], CONFIG["num_classes"])


def _ledger(url: str) -> Ledger:
    db = Ledger(url)
    db.register_party(PARTY, 1e6, actor="guardian-cli")
    db.create_task(TASK, CONFIG)
    return db


def _reserve(db: Ledger, key: str) -> int:
    return db.reserve(
        key, TASK, QUERIER, BATCH, {PARTY: MECH.worst_case(BATCH)}, mechanism=MECH.name, quorum=1
    ).round_id


@pytest.fixture
def pg(postgres_url: str) -> Iterator[Ledger]:
    db = _ledger(postgres_url)
    yield db
    db.close()


# -- 1. limits lowered while a reservation waits for its locks (PostgreSQL) -------------


def _while_spend_row_locked(db: Ledger, lower: Callable[[], None]) -> BaseException | int:
    """Reserve a round on another thread while this one holds ``PARTY``'s spend row
    locked; once that reservation waits for the lock (seen in pg_stat_activity, not by
    timing), ``lower`` runs and commits, then the lock is let go. Returns what the
    reservation raised, or its round id."""
    out: list[BaseException | int] = []

    def reserve() -> None:
        try:
            out.append(_reserve(db, "k-waiting"))
        except BaseException as err:  # what it raised is the result
            out.append(err)

    with db.engine.connect() as blocker:
        pid = blocker.execute(text("SELECT pg_backend_pid()")).scalar_one()
        blocker.execute(
            text("SELECT loss FROM party_spend WHERE party = :p FOR UPDATE"), {"p": PARTY}
        )
        worker = threading.Thread(target=reserve)
        worker.start()
        with db.engine.connect() as watch:
            waiting = text(
                "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
            )
            while not out and not watch.execute(waiting, {"pid": pid}).scalar_one():
                watch.rollback()
        assert not out, f"the reservation did not wait for the spend row: {out}"
        lower()
        blocker.rollback()
    worker.join(timeout=120)
    assert not worker.is_alive()
    return out[0]


def test_an_allowance_lowered_while_a_reservation_waits_is_enforced(pg: Ledger) -> None:
    """The querier's allowance, cut to almost nothing and committed before the
    reservation holds its locks, must refuse it: read before the locks (as one statement
    with the round-key check), a READ COMMITTED reservation admits a round over it."""
    got = _while_spend_row_locked(pg, lambda: pg.set_allowance(QUERIER, 1e-6, actor="guardian-cli"))
    assert isinstance(got, QuorumError), got
    assert pg.open_rounds() == []
    assert float(pg.spent_loss(PARTY).max()) == 0.0
    pg.verify_audit()


def test_a_cap_lowered_while_a_reservation_waits_is_enforced(pg: Ledger) -> None:
    """The party's cap, cut to almost nothing and committed before the reservation holds
    its locks, must refuse it (the cap is read with the locked spend row)."""
    got = _while_spend_row_locked(
        pg, lambda: pg.declare_cap(PARTY, 1e-6, actor=PARTY, reason="a test lowers it")
    )
    assert isinstance(got, QuorumError), got
    assert pg.open_rounds() == []
    assert float(pg.spent_loss(PARTY).max()) == 0.0
    pg.verify_audit()
