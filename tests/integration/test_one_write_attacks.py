"""Attacks on "one ledger write a round": a hospital holds its settlements in memory
and writes them in the transaction of its next reservation (or a flush).

Each test fails if a held settlement could make the hospital's own ledger count less
than it voted on (in the database, or as its cap check sees it), if a guardian history
that went back or was rewritten could slip past the audit-head check while heads are
held, if a write inside the batch could open a second connection on its thread (on
SQLite, where every transaction begins IMMEDIATE, that waits out the lock), or if the
guardian settles a party from the round's rows differently than before.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError

from capc.mechanisms.registry import from_config
from capc.round.errors import BatchBrokenError, LedgerRefusedError
from capc.round.ledger import RoundState
from capc.round.messages import Settlement, SettlementKind
from capc.round.party import pack_mask
from capc.task_config import config_hash
from services.answerer.budget import GUARDIAN_HEAD, OwnBudget, VoteRefusedError
from services.common import serde
from services.common.ledger import Ledger
from services.common.ledger.audit import AuditHead, sign_head
from services.common.ledger.records import KeptSetting
from services.common.ledger.tables import INSERT_SETTING
from services.common.protocol import PROTOCOL_VERSION
from services.guardian import budgets
from services.proto.capc.v1 import common_pb2, guardian_pb2
from tests.own_rounds import admit, define

NAME = "hospital-a"
TASK = "t"
#: Some queries go unanswered: a round's charge is below its worst case.
CONFIG: dict[str, Any] = {
    "num_classes": 10,
    "input_shape": [4],
    "mechanism": {"name": "robust-confident-gnmax", "sigma": 1.5, "threshold": 3.5, "sigma1": 2.0},
    "quorum": 1,
}
BATCH = 8
MECH = from_config(CONFIG["mechanism"], CONFIG["num_classes"])
#: Nothing answered: the smallest charge a round can have.
NONE_ANSWERED = np.zeros(BATCH, dtype=bool)


HEADER = common_pb2.Header(
    protocol_version=PROTOCOL_VERSION, task=TASK, config_hash=config_hash(CONFIG)
)


class World:
    """The guardian's ledger (signed) and one hospital's own at ``url``."""

    def __init__(self, directory: Path, url: str, cap: float = 1e4) -> None:
        self.key = Ed25519PrivateKey.generate()
        self.guardian = Ledger(str(directory / "guardian.db"), signer=self.key)
        self.guardian.register_party(NAME, 1e6, actor="guardian-cli")
        self.guardian.create_task(TASK, CONFIG)
        self.url = url
        self.own = OwnBudget(NAME, Ledger(url), cap)
        self.own.welcome(budgets.registered(self.guardian, NAME))
        define(self.own, CONFIG, HEADER)

    def restart(self, cap: float) -> None:
        """The hospital restarted with another cap (its held settlements are gone)."""
        self.own = OwnBudget(NAME, self.own.ledger, cap, cap_reason="a test sets it")
        self.own.welcome(budgets.registered(self.guardian, NAME))
        define(self.own, CONFIG, HEADER)

    def open(
        self, others: tuple[str, ...] = ()
    ) -> tuple[int, guardian_pb2.RoundWork, common_pb2.Header]:
        """A round reserved at the guardian (for the hospital and ``others``); its id and
        the work the hospital gets."""
        key = f"k{self.guardian.last_round() + 1}"
        worst = {p: MECH.worst_case(BATCH) for p in (NAME, *others)}
        res = self.guardian.reserve(
            key, TASK, "student", BATCH, worst, mechanism=MECH.name, quorum=1
        )
        work = guardian_pb2.RoundWork(
            round_id=res.round_id,
            queries=common_pb2.QueryBatch(
                recipe=common_pb2.Recipe(generator="gaussian", count=BATCH, shape=[4])
            ),
            mechanism=serde.mechanism_to_proto(MECH),
            vote_weight=1.0,
        )
        return res.round_id, work, HEADER

    def admitted(self) -> int:
        """A round the hospital admitted (reserved in its own ledger)."""
        rid, work, header = self.open()
        admit(self.own, work, header)
        return rid

    def commit(self, rid: int, answered: np.ndarray = NONE_ANSWERED) -> guardian_pb2.RoundSettled:
        """The guardian's release and commit of round ``rid``; its settlement for the hospital."""
        self.guardian.release(rid)
        self.guardian.commit(rid, {NAME: MECH.event(answered)}, outcome=budgets.outcome(answered))
        settled = budgets.settlement_of(self.guardian, NAME, rid)
        assert settled is not None
        return settled

    def shown(
        self, rid: int, kind: SettlementKind, head: AuditHead | None = None
    ) -> guardian_pb2.RoundSettled:
        """A settlement of ``rid`` of ``kind`` under ``head`` (the guardian's current one)."""
        answered = pack_mask(NONE_ANSWERED) if kind == "charged" else b""
        shown = self.guardian.audit_head() if head is None else head
        return serde.settlement_to_proto(
            Settlement(rid, NAME, kind, answered),
            serde.audit_head_to_proto(shown),
        )

    def loss(self, answered: np.ndarray | None) -> np.ndarray:
        """The loss vector of a round that answered ``answered`` (None: its worst case)."""
        event_ = MECH.worst_case(BATCH) if answered is None else MECH.event(answered)
        return np.asarray(self.own.ledger.accounting.filter_cost(event_))

    def cap_between(self, low: np.ndarray, high: np.ndarray) -> float:
        """A cap that the loss ``low`` fits and ``high`` does not."""
        acct, delta = self.own.ledger.accounting, self.own.ledger.delta
        lo, hi = acct.spent(low, delta).epsilon, acct.spent(high, delta).epsilon
        assert lo < hi, (lo, hi)
        return (lo + hi) / 2

    def stored_head(self) -> dict[str, Any]:
        value = self.own.ledger.setting(GUARDIAN_HEAD)
        assert value is not None
        out: dict[str, Any] = json.loads(value)
        return out


@pytest.fixture
def world(tmp_path: Path, ledger_url: str) -> Iterator[World]:
    w = World(tmp_path, ledger_url)
    yield w
    w.own.ledger.close()
    w.guardian.close()


# -- 1. the guardian settles each party from one read of the round ---------------------


def test_a_party_that_dropped_out_is_told_it_was_not_charged(ledger_url: str) -> None:
    """A party with a reservation but no charge (its vote was not used) holds a charge
    row without an event: the guardian must say "not charged", not its worst case."""
    ledger = Ledger(ledger_url, signer=Ed25519PrivateKey.generate())
    try:
        for p in ("a", "b"):
            ledger.register_party(p, 1e6)
        ledger.create_task(TASK, CONFIG)
        worst = MECH.worst_case(BATCH)
        res = ledger.reserve(
            "k1", TASK, "student", BATCH, {"a": worst, "b": worst}, mechanism=MECH.name, quorum=1
        )
        ledger.release(res.round_id)
        ledger.commit(res.round_id, {"a": MECH.event(NONE_ANSWERED)})  # b dropped out
        out = budgets.settlements(ledger, res.round_id, ["a", "b"])
        assert out["a"].settlement == guardian_pb2.SETTLEMENT_WORST_CASE
        # Told its worst case, b would charge itself for a vote nobody used.
        assert out["b"].settlement == guardian_pb2.SETTLEMENT_NOT_CHARGED
        alone = budgets.settlement_of(ledger, "b", res.round_id)
        assert alone is not None and alone.settlement == guardian_pb2.SETTLEMENT_NOT_CHARGED
    finally:
        ledger.close()


def test_a_party_that_dropped_out_reports_what_the_guardian_holds(world: World) -> None:
    """The admin view compares the hospital's report with the guardian's ledger: a round
    in which its vote was not used (another party's was) must leave them agreeing."""
    world.guardian.register_party("hospital-b", 1e6, actor="guardian-cli")
    rid, work, header = world.open(("hospital-b",))
    admit(world.own, work, header)
    world.guardian.release(rid)
    world.guardian.commit(rid, {"hospital-b": MECH.event(NONE_ANSWERED)})
    settled = budgets.settlement_of(world.guardian, NAME, rid)
    assert settled is not None and world.own.settle(settled)
    budgets.store_report(world.guardian, NAME, world.own.report())
    seen = budgets.compare(world.guardian, world.guardian.budget(NAME))
    assert (seen.state, seen.through, seen.open_rounds) == ("agree", rid, 0)
    np.testing.assert_allclose(world.own.ledger.spent_loss(NAME), 0.0, atol=0)


def test_a_report_shows_the_settlements_held(world: World) -> None:
    """A report is sent a while after the settlements it covers (services/answerer/party.py):
    it shows them as settled, agrees with the guardian, and names the rounds still open."""
    r1, r2, r3 = world.admitted(), world.admitted(), world.admitted()
    assert world.own.settle(world.commit(r1))
    assert world.own.settle(world.commit(r2))
    assert world.own.open_rounds() == [r3]
    report = world.own.report()
    assert (report.through_round, report.open_rounds) == (r2, 1)
    budgets.store_report(world.guardian, NAME, report)
    seen = budgets.compare(world.guardian, world.guardian.budget(NAME))
    assert (seen.state, seen.through) == ("agree", r2)
    expected = 2 * world.loss(NONE_ANSWERED) + world.loss(None)
    np.testing.assert_allclose(world.own.ledger.spent_loss(NAME), expected, rtol=1e-9)


# -- 2. held settlements and the reservation they are written with ---------------------


def test_held_settlements_are_written_with_a_reservation_the_cap_refuses(world: World) -> None:
    worst, actual = world.loss(None), world.loss(NONE_ANSWERED)
    assert (actual < worst).all()
    # Room for one round's charge and one worst case, not for two worst cases, nor two
    # charges and a worst case.
    world.restart(world.cap_between(actual + worst, 2 * actual + worst))
    db = world.own.ledger
    r1 = world.admitted()
    assert world.own.settle(world.commit(r1))
    # The second round fits only once the first round's settlement is in: it is real,
    # and written in the same transaction as the reservation.
    r2 = world.admitted()
    assert db.round_state(r1) == RoundState.COMMITTED
    np.testing.assert_allclose(db.spent_loss(NAME), actual + worst, rtol=1e-9)
    assert world.own.settle(world.commit(r2))
    # A third does not fit even with r2 settled: refused on the cap, and r2's
    # settlement, held until now, is written all the same.
    r3, work, header = world.open()
    with pytest.raises(VoteRefusedError) as refused:
        admit(world.own, work, header)
    assert refused.value.budget
    assert db.round_charges(r3) is None
    assert db.round_state(r2) == RoundState.COMMITTED
    np.testing.assert_allclose(db.spent_loss(NAME), 2 * actual, rtol=1e-9)
    assert db.open_rounds() == []


def test_held_settlements_are_written_with_a_replayed_round(world: World) -> None:
    rid, work, header = world.open()
    admit(world.own, work, header)
    assert world.own.settle(world.commit(rid))
    with pytest.raises(VoteRefusedError):
        admit(world.own, work, header)  # replayed: a round is voted in once
    db = world.own.ledger
    assert db.round_state(rid) == RoundState.COMMITTED
    np.testing.assert_allclose(db.spent_loss(NAME), world.loss(NONE_ANSWERED), rtol=1e-9)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("not_charged", "charged"),
        ("not_charged", "worst_case"),
        ("worst_case", "not_charged"),
        ("charged", "not_charged"),
        ("charged", "worst_case"),
    ],
)
def test_a_second_settlement_of_a_held_round_changes_nothing(
    world: World, first: SettlementKind, second: SettlementKind
) -> None:
    """The guardian says one thing, then another (a replay, a bug): the first word stands,
    held or written, and nothing is counted below what the first implies."""
    rid = world.admitted()
    other = world.admitted()  # stays open: the ledger is never empty
    world.guardian.release(rid)
    world.guardian.commit(rid, {NAME: MECH.worst_case(BATCH)})
    assert world.own.settle(world.shown(rid, first))
    assert not world.own.settle(world.shown(rid, second))
    assert world.own.open_rounds() == [other]
    world.own.flush()
    assert not world.own.settle(world.shown(rid, second))
    world.own.flush()
    db = world.own.ledger
    expected = {
        "not_charged": world.loss(None),
        "worst_case": 2 * world.loss(None),
        "charged": world.loss(None) + world.loss(NONE_ANSWERED),
    }[first]
    np.testing.assert_allclose(db.spent_loss(NAME), expected, rtol=1e-9)
    state = RoundState.ABORTED if first == "not_charged" else RoundState.COMMITTED
    assert db.round_state(rid) == state


def test_a_held_settlement_that_cannot_be_written_keeps_the_reservation(world: World) -> None:
    """A held settlement whose write is refused (the round was settled otherwise in the
    meantime, here by a second process on the same ledger) is logged; nothing it would
    have returned is returned, and its round is asked about again."""
    rid = world.admitted()
    assert world.own.settle(world.shown(rid, "not_charged"))  # held: would return it all
    # Another writer (an operator's tool) commits the round at its worst case meanwhile.
    other = Ledger(world.url)
    other.commit_at_reservation(rid, actor="operator", release=True)
    other.close()
    world.own.flush()  # the abort is refused: the round is committed
    db = world.own.ledger
    assert db.round_state(rid) == RoundState.COMMITTED
    np.testing.assert_allclose(db.spent_loss(NAME), world.loss(None), rtol=1e-9)
    assert world.own.open_rounds() == []


def test_a_refused_write_inside_a_batch_leaves_nothing_and_keeps_the_rest(
    world: World,
) -> None:
    """A savepoint refused after it wrote (a setting kept, then a charge for a party the
    round never reserved) leaves none of its writes; the batch's others stand."""
    db = world.own.ledger
    r1, r2 = world.admitted(), world.admitted()
    with db.batch():
        db.abort(r1, actor="guardian", keep=KeptSetting("kept-first", "1", actor="guardian"))
        with pytest.raises(LedgerRefusedError):
            db.commit(
                r2,
                {"stranger": MECH.worst_case(BATCH)},
                actor="guardian",
                release=True,
                keep=KeptSetting("kept-second", "2", actor="guardian"),
            )
    assert db.round_state(r1) == RoundState.ABORTED
    assert db.setting("kept-first") == "1"
    assert db.setting("kept-second") is None
    assert db.round_state(r2) == RoundState.RESERVED
    np.testing.assert_allclose(db.spent_loss(NAME), world.loss(None), rtol=1e-9)


def test_a_batch_that_fails_forgets_the_task_it_wrote(world: World) -> None:
    """The first round of a task writes the task in its batch; a database error there
    (a lock waited out, a dropped connection) rolls the task back with the round, and
    the next round of the task must write it again, not be refused as unknown."""
    db = world.own.ledger
    fail = [True]

    @event.listens_for(db.engine, "before_cursor_execute")
    def _once(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if fail[0] and statement.lstrip().upper().startswith("INSERT INTO ROUNDS"):
            fail[0] = False
            raise RuntimeError("the database went away")

    _, work, header = world.open()
    with pytest.raises(RuntimeError):
        admit(world.own, work, header)
    assert db.open_rounds() == []
    rid = world.admitted()
    assert db.open_rounds() == [rid]


def test_a_write_that_fails_part_way_breaks_its_batch(world: World) -> None:
    """A batch's steps run with no savepoint of their own, so a step that fails in the
    database (here the new round's row, refused as a duplicate: the ledger reports that
    as a refusal) must take the whole batch with it: the held settlement written before
    it is rolled back, its round stays reserved at its worst case (an over-count, asked
    about again), and the party refuses the round. Committing the rest would keep a
    settlement whose round the party then reserved twice, or half a round."""
    db = world.own.ledger
    r1 = world.admitted()
    assert world.own.settle(world.shown(r1, "not_charged"))  # held: returns the worst case
    fail = [True]

    @event.listens_for(db.engine, "before_cursor_execute")
    def _taken(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if fail[0] and statement.lstrip().upper().startswith("INSERT INTO ROUNDS"):
            fail[0] = False
            raise IntegrityError(statement, None, Exception("the round's id is taken"))

    r2, work, header = world.open()
    with pytest.raises(VoteRefusedError, match="cannot be accounted"):
        admit(world.own, work, header)
    assert db.round_state(r1) == RoundState.RESERVED
    assert db.round_charges(r2) is None
    np.testing.assert_allclose(db.spent_loss(NAME), world.loss(None), rtol=1e-9)
    assert world.own.open_rounds() == [r1]
    db.verify_audit()
    # Settled again when it is asked about, and written with the next round.
    assert world.own.settle(world.shown(r1, "not_charged"))
    world.admitted()
    assert db.round_state(r1) == RoundState.ABORTED
    np.testing.assert_allclose(db.spent_loss(NAME), world.loss(None), rtol=1e-9)
    db.verify_audit()


def test_a_refusal_after_a_write_breaks_its_batch(tmp_path: Path) -> None:
    """Every step raises its refusals before it writes, which is what lets a batch run
    its steps with no savepoints. On SQLite, which counts changed rows, a step that
    breaks the rule anyway breaks its batch instead of committing half its writes."""
    db = Ledger(str(tmp_path / "own.db"))
    db.register_party(NAME, 10.0, actor=NAME)
    with pytest.raises(BatchBrokenError), db.batch():
        db.keep_setting("kept-first", "1", actor=NAME)
        with pytest.raises(LedgerRefusedError), db._write() as conn:
            conn.execute(INSERT_SETTING, {"key": "half-written", "value": "1"})
            raise LedgerRefusedError("refused after it wrote")
    assert db.setting("kept-first") is None
    assert db.setting("half-written") is None
    db.verify_audit()
    db.close()


# -- 3. the guardian's audit head, checked while heads are held --------------------------


@pytest.mark.parametrize("how", ["went_back", "rewritten"])
def test_a_guardian_history_that_changes_is_caught_while_heads_are_held(
    world: World, how: str
) -> None:
    """The party believed a settlement shown with the guardian's head at entry n; a later
    settlement shown with an earlier head, or another head at n, is not believed, held
    or not: the round stays reserved."""
    r1 = world.admitted()
    middle = world.guardian.audit_head()  # a real, signed head the party has not seen
    r2 = world.admitted()
    first = world.commit(r1)
    world.guardian.release(r2)
    world.guardian.commit(r2, {NAME: MECH.event(NONE_ANSWERED)})
    newest = world.guardian.audit_head()
    assert world.own.settle(world.shown(r1, "charged", newest))
    assert first.head.seq <= newest.seq and middle.seq < newest.seq
    if how == "went_back":
        head = middle
    else:
        other = "ab" * 32
        head = AuditHead(newest.seq, other, sign_head(world.key, newest.seq, other))
    assert not world.own.settle(world.shown(r2, "not_charged", head))
    assert world.own.open_rounds() == [r2]
    assert world.own.ledger.audit_entries(limit=1)[0].action == "guardian_head_conflict"
    world.own.flush()
    assert world.stored_head()["seq"] == newest.seq


def test_the_newest_head_is_the_one_kept(world: World) -> None:
    """Rounds end out of order (and a heartbeat asks again): the head kept after the
    held settlements are written is the newest the party was shown, so a rewrite of it
    is caught after a restart too."""
    r1, r2 = world.admitted(), world.admitted()
    world.commit(r2)
    older = world.guardian.audit_head()
    world.commit(r1)
    newer = world.guardian.audit_head()
    assert older.seq < newer.seq
    assert world.own.settle(world.shown(r2, "charged", older))
    assert world.own.settle(world.shown(r1, "charged", newer))
    world.own.flush()
    assert world.stored_head()["seq"] == newer.seq
    # The newest head rewritten is caught.
    r3 = world.admitted()
    world.commit(r3)
    other = "cd" * 32
    rewritten = AuditHead(newer.seq, other, sign_head(world.key, newer.seq, other))
    assert not world.own.settle(world.shown(r3, "not_charged", rewritten))
    assert world.own.open_rounds() == [r3]


# -- 4. threads: the pool admits, the stream settles, the beat reports ------------------


def test_a_batch_opens_no_second_connection_on_its_thread(world: World) -> None:
    """Every statement run on a thread while its batch is open runs on the batch's
    connection (on SQLite a second one would wait out the first's write lock)."""
    db = world.own.ledger
    strays: list[str] = []

    @event.listens_for(db.engine, "before_cursor_execute")
    def _check(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        batch = getattr(db._batching, "batch", None)
        if batch is None:
            return
        if conn.connection.driver_connection is not batch.conn.connection.driver_connection:
            strays.append(statement.split("\n")[0])

    worst, actual = world.loss(None), world.loss(NONE_ANSWERED)
    r1, first, header = world.open()
    admit(world.own, first, header)
    r2, r3 = world.admitted(), world.admitted()
    world.commit(r1)
    world.commit(r2)
    assert world.own.settle(world.shown(r1, "charged"))
    assert world.own.settle(world.shown(r2, "worst_case"))
    assert world.own.settle(world.shown(r3, "not_charged"))
    # A new task (written in the batch), then a refused round and a replayed one.
    world.admitted()
    world.own.report()
    world.restart(world.cap_between(actual + 2 * worst, actual + 3 * worst))
    _, work, header = world.open()
    with pytest.raises(VoteRefusedError):
        admit(world.own, work, header)
    with pytest.raises(VoteRefusedError):
        admit(world.own, first, header)  # replayed
    world.own.flush()
    world.own.report()
    assert strays == []


@pytest.mark.slow
def test_admitting_settling_and_reporting_on_three_threads_never_under_counts(
    world: World,
) -> None:
    """The party's three threads at once, as in services/answerer/party.py: no deadlock,
    no report above its cap, and once all is written the ledger charges what the
    guardian charged (rounds it could not afford refused, with nothing written)."""
    worst, actual = world.loss(None), world.loss(NONE_ANSWERED)
    rounds = 12
    # Room for every round's charge and one worst case, not two: a round admitted before
    # the last one's settlement is in may be refused.
    world.restart(world.cap_between(rounds * actual + worst, rounds * actual + 2 * worst))
    works = [world.open() for _ in range(rounds)]
    settled: queue.Queue[guardian_pb2.RoundSettled | None] = queue.Queue()
    admitted: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()
    reports: list[guardian_pb2.SpendReport] = []

    def pool() -> None:
        try:
            for rid, work, header in works:
                try:
                    admit(world.own, work, header)
                except VoteRefusedError:
                    world.guardian.abort(rid, reason="refused")
                    continue
                admitted.append(rid)
                settled.put(world.commit(rid))
        except BaseException as err:
            errors.append(err)
        finally:
            settled.put(None)

    def stream() -> None:
        try:
            while (msg := settled.get()) is not None:
                world.own.settle(msg)
        except BaseException as err:
            errors.append(err)
        finally:
            done.set()

    def beat() -> None:
        try:
            while not done.is_set():
                reports.append(world.own.report())
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=f, daemon=True) for f in (pool, stream, beat)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)  # a deadlock shows as a thread still alive
    assert not any(t.is_alive() for t in threads), "the party's threads deadlocked"
    assert errors == []
    world.own.flush()
    db = world.own.ledger
    assert db.open_rounds() == []
    np.testing.assert_allclose(
        db.spent_loss(NAME), world.guardian.spent_loss(NAME), rtol=1e-9, atol=0
    )
    np.testing.assert_allclose(db.spent_loss(NAME), len(admitted) * actual, rtol=1e-9)
    cap = world.own.cap
    assert all(r.epsilon_spent <= cap * (1 + 1e-12) for r in reports)
    assert reports


def test_a_settlement_decided_while_held_ones_are_written_cannot_lower_the_count(
    tmp_path: Path, postgres_url: str
) -> None:
    """The stream thread settles a round again while the pool thread's batch writes the
    round's held settlement. The port's lock makes it wait for the batch, and it then
    sees the round settled; were it to read first (PostgreSQL: the snapshot before the
    batch's commit, still reserved), it would decide a second, different settlement
    that the ledger refuses. Either way the round keeps what the first one charged."""
    world = World(tmp_path, postgres_url)
    db = world.own.ledger
    worst = world.loss(None)
    r1 = world.admitted()
    world.guardian.release(r1)
    world.guardian.commit(r1, {NAME: MECH.worst_case(BATCH)})
    assert world.own.settle(world.shown(r1, "worst_case"))  # held
    later = world.shown(r1, "not_charged")
    batching = threading.current_thread()
    read = threading.Event()
    decided: list[bool] = []
    racer: list[threading.Thread] = []

    def stream() -> None:
        decided.append(world.own.settle(later))

    @event.listens_for(db.engine, "after_cursor_execute")
    def _interleave(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        here = threading.current_thread()
        if here is batching and statement.lstrip().upper().startswith("UPDATE CHARGES"):
            if not racer:
                racer.append(threading.Thread(target=stream, daemon=True))
                racer[0].start()
                # Give the stream thread the chance to read the round before this batch
                # commits; it cannot while the port's lock holds it, and then need not.
                read.wait(timeout=5)
        elif racer and here is racer[0] and "FROM charges" in statement:
            read.set()

    r2 = world.admitted()
    racer[0].join(timeout=60)
    assert not racer[0].is_alive()
    event.remove(db.engine, "after_cursor_execute", _interleave)
    world.own.flush()  # the second settlement: refused (the round is committed), logged
    assert db.round_state(r1) == RoundState.COMMITTED
    np.testing.assert_allclose(db.spent_loss(NAME), 2 * worst, rtol=1e-9)
    assert world.own.open_rounds() == [r2]
    db.close()
    world.guardian.close()


# -- 5. a crash while held settlements are written with a refused reservation -----------

#: The exit status of a child that died at its crash point.
CRASHED = 86


def _hospital(url: str, cap: float, registered: bytes, rounds: list[bytes], where: str) -> None:
    """Admit and settle the first two of ``rounds`` (work, header, settled, serialised),
    then be refused the third on the cap and die in that batch (``mid``: right after a
    held settlement's charge is written; ``commit``: at its commit)."""
    own = OwnBudget(NAME, Ledger(url), cap)
    own.welcome(guardian_pb2.Registered.FromString(registered))
    msgs = [
        (
            guardian_pb2.RoundWork.FromString(rounds[i]),
            common_pb2.Header.FromString(rounds[i + 1]),
            guardian_pb2.RoundSettled.FromString(rounds[i + 2]),
        )
        for i in range(0, len(rounds), 3)
    ]
    for work, header, _ in msgs[:2]:
        admit(own, work, header, CONFIG)
    for _, _, settled in msgs[:2]:
        if not own.settle(settled):
            os._exit(1)
    wrote = False

    @event.listens_for(own.ledger.engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        nonlocal wrote
        if statement.lstrip().upper().startswith("UPDATE CHARGES"):
            wrote = True
            if where == "mid":
                os._exit(CRASHED)

    @event.listens_for(own.ledger.engine, "commit")
    def _commit(conn: Any) -> None:
        if wrote and where == "commit":
            os._exit(CRASHED)

    try:
        admit(own, *msgs[2][:2])
    except VoteRefusedError:
        os._exit(2)  # refused, yet its batch committed without dying
    os._exit(3)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["mid", "commit"])
def test_a_crash_in_a_refused_rounds_batch_loses_only_settlements(
    tmp_path: Path, ledger_url: str, where: str
) -> None:
    world = World(tmp_path, ledger_url)
    every = np.ones(BATCH, dtype=bool)
    worst, charged = world.loss(None), world.loss(every)
    # Shown at connection, before the rounds: older than every settlement's head.
    registered = budgets.registered(world.guardian, NAME).SerializeToString()
    rounds: list[bytes] = []
    ids = []
    for _ in range(3):
        rid, work, header = world.open()
        ids.append(rid)
        rounds += [work.SerializeToString(), header.SerializeToString()]
        rounds.append(world.commit(rid, every).SerializeToString())
    # Two worst cases fit; once both rounds are settled, no third one does.
    cap = world.cap_between(2 * worst, 2 * charged + worst)
    world.own.ledger.close()
    # Fresh processes forked from multiprocessing's server, which imported this module
    # once (spawned ones imported it again each time).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    proc = ctx.Process(target=_hospital, args=(ledger_url, cap, registered, rounds, where))
    proc.start()
    proc.join(timeout=300)
    if proc.exitcode is None:
        proc.kill()
        pytest.fail("the hospital's process did not end")
    assert proc.exitcode == CRASHED
    own = OwnBudget(NAME, Ledger(ledger_url), cap)
    # Both settlements died with the batch: the two rounds stay reserved at their worst
    # case (an over-count the guardian settles again), the refused one left nothing.
    assert own.open_rounds() == ids[:2]
    assert own.ledger.round_charges(ids[2]) is None
    np.testing.assert_allclose(own.ledger.spent_loss(NAME), 2 * worst, rtol=1e-9)
    for msg in rounds[2::3][:2]:
        assert own.settle(guardian_pb2.RoundSettled.FromString(msg))
    own.flush()
    np.testing.assert_allclose(own.ledger.spent_loss(NAME), 2 * charged, rtol=1e-9)
    own.ledger.close()
    world.guardian.close()
