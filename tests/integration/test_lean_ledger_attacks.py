"""Attacks on the leaner own-ledger path (batches without savepoints, one-statement
spend reads, BEGIN IMMEDIATE in the SQLite dialect) on real SQLite files and the
real PostgreSQL server.

Each test fails if a limit lowered before a reservation took its locks could be read
stale by it (PostgreSQL, READ COMMITTED), if a broken batch could commit part of
itself, or if a refused step could leave a write or an audit entry behind.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from capc.round.errors import BatchBrokenError, LedgerRefusedError, QuorumError
from capc.round.ledger import RoundState
from services.common.ledger import Ledger

# The task and round of the one-write attacks.
from tests.integration.test_one_write_attacks import BATCH, CONFIG, MECH, TASK

PARTY = "hospital-a"
QUERIER = "student"


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


def _while_spend_row_locked(db: Ledger, lower: Callable[[], object]) -> BaseException | int:
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


# -- 2. SQLite: every transaction holds the write lock from its BEGIN -----------------


def _write_lock_free(path: Path) -> bool:
    """Whether another connection could take ``path``'s write lock right now (no wait)."""
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as err:
        if "locked" not in str(err):
            raise
        return False
    finally:
        other.close()  # rolls back what it began
    return True


def test_every_sqlite_transaction_begins_immediate(tmp_path: Path) -> None:
    """Budget checks must not interleave: a read-then-write (one statement reads spend,
    cap and querier share on SQLite) is safe only if its transaction holds the write
    lock from its BEGIN. Moved from a begin event to the dialect: a transaction begun any
    way the ledger begins one (a read's autobegin, engine.begin, a batch) must hold it."""
    path = tmp_path / "own.db"
    db = _ledger(str(path))
    assert _write_lock_free(path)
    with db.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        assert not _write_lock_free(path), "a read's transaction began DEFERRED"
    with db.engine.begin():
        assert not _write_lock_free(path), "engine.begin() began DEFERRED"
    with db.batch():
        assert not _write_lock_free(path), "a batch began DEFERRED"
    assert _write_lock_free(path)
    db.close()


# -- 3. a broken batch whose error its caller swallowed --------------------------------


def test_a_step_failing_after_its_writes_breaks_a_batch_even_if_caught(
    ledger_url: str,
) -> None:
    """A settlement (abort) that fails after it wrote the spend rows, its error caught
    by the caller inside the batch (a deviating or careless caller): the batch must not
    commit the half-done abort (a returned reservation with the round still reserved is
    an under-count, and aborting it again would return it twice) nor the reservation
    made in it."""
    db = _ledger(ledger_url)
    r1 = _reserve(db, "k1")
    before = db.spent_loss(PARTY)
    armed = [True]

    @event.listens_for(db.engine, "before_cursor_execute")
    def _fail(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if armed[0] and statement.lstrip().upper().startswith("DELETE FROM CHARGES"):
            armed[0] = False
            raise OperationalError(statement, None, Exception("disk I/O error"))

    with pytest.raises(BatchBrokenError), db.batch():
        r2 = _reserve(db, "k2")
        with contextlib.suppress(OperationalError):
            db.abort(r1, reason="a test")
    assert not armed[0], "the failure was not injected"
    assert db.round_state(r1) == RoundState.RESERVED
    assert db.round_charges(r2) is None
    assert db.open_rounds() == [r1]
    np.testing.assert_allclose(db.spent_loss(PARTY), before, rtol=1e-12)
    db.verify_audit()
    # Nothing of it stands: the round aborts once, returning its reservation once.
    db.abort(r1, reason="again")
    assert float(db.spent_loss(PARTY).max()) == 0.0
    db.verify_audit()
    db.close()


def test_a_batchs_audit_entries_follow_its_steps_in_order(ledger_url: str) -> None:
    """A batch mixes Core steps (entries appended at its end) and ORM steps (a savepoint
    each): the chain must list its entries in the order its steps ran, and a step
    refused inside it must leave no entry."""
    db = _ledger(ledger_url)
    r1 = _reserve(db, "k1")
    seen = {e.seq for e in db.audit_entries(limit=1000)}
    with db.batch():
        db.keep_setting("first", "1", actor=PARTY)
        db.create_task("t2", CONFIG, actor=PARTY)
        with pytest.raises(LedgerRefusedError):
            db.create_task("t2", {**CONFIG, "num_classes": 9}, actor=PARTY)
        with pytest.raises(LedgerRefusedError):
            db.release(r1 + 100)
        db.abort(r1, reason="a test")
        db.keep_setting("last", "1", actor=PARTY)
    db.verify_audit()
    made = [e for e in db.audit_entries(limit=1000) if e.seq not in seen]
    got = [
        (e.action, e.detail.get("key") or e.detail.get("name") or e.detail.get("round"))
        for e in sorted(made, key=lambda e: e.seq)
    ]
    assert [a for a, _ in got] == ["setting", "create_task", "abort", "setting"], got
    assert db.setting("first") == "1" and db.setting("last") == "1"
    db.close()


# -- 4. two processes batching on one ledger -------------------------------------------


def _batching(url: str, key: str, rounds: int, start: Any, done: Any) -> None:
    """Each round: the previous round settled at its reservation and the next reserved,
    in one batch (as a hospital writes them); begun once every process is ready."""
    db = Ledger(url)
    db.budget(PARTY)  # connected and warm before the start
    start.wait(timeout=120)
    prev: int | None = None
    for i in range(rounds):
        with db.batch():
            if prev is not None:
                db.commit_at_reservation(prev, actor="guardian", release=True)
            prev = _reserve(db, f"{key}-{i}")
    db.close()
    done.put(key)


@pytest.mark.slow
def test_two_processes_batching_on_one_ledger_lose_no_update(ledger_url: str) -> None:
    """Two processes each settle and reserve rounds in batches on one ledger (a SQLite
    file, one PostgreSQL database): every reservation is counted, none is lost to the
    other's write of the same spend row, and the chain verifies."""
    db = _ledger(ledger_url)
    worst = db._loss(MECH.worst_case(BATCH), "worst case")
    n = 30
    # Fresh processes forked from multiprocessing's server, which imported this module
    # once (spawned ones imported it again each time).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    start, done = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_batching, args=(ledger_url, k, n, start, done)) for k in ("a", "b")
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        if p.exitcode is None:
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    finished = sorted(done.get(timeout=10) for _ in procs)
    assert finished == ["a", "b"]
    np.testing.assert_allclose(db.spent_loss(PARTY), 2 * n * worst, rtol=1e-9)
    assert db.budget(PARTY).rounds == 2 * n
    assert len(db.open_rounds()) == 2
    db.verify_audit()
    db.close()
