"""A hospital killed between its reservation and its settlement: its own ledger may
over-count, never under-count, and a hospital past its cap never votes.

The hospital runs in a child process (its real ``OwnBudget`` over its real ledger,
SQLite or PostgreSQL) and dies by ``os._exit`` at a chosen point: in the middle of
the reservation's or the settlement's transaction (right after the statement that
writes the charge), at that transaction's commit, or after it voted and before it
was told how the round ended. A settlement is written in the next round's
reservation's transaction (or when the party stops), so a crash there loses both. Its vote "leaves" when a line naming the round is
written to a file, as a real party sends its shares only after ``admit`` returns.
The test process then restarts the hospital on the same ledger and checks it
against the guardian's, and checks both audit chains with ``capc audit verify``.
No sleeps: the child's death is synchronous with the point it dies at.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine, event
from sqlalchemy.exc import OperationalError

from capc.mechanisms.registry import from_config
from capc.task_config import canonical_json, config_hash
from services.answerer.budget import OwnBudget, VoteRefusedError
from services.answerer.party import HEARTBEAT_S, Beat
from services.audit.verify import verify
from services.common import serde
from services.common.buffers import BoundedBuffer
from services.common.ledger import Ledger
from services.common.protocol import PROTOCOL_VERSION
from services.guardian import budgets
from services.proto.capc.v1 import common_pb2, guardian_pb2
from tests.own_rounds import admit

NAME = "hospital-a"
#: The exit status of a child that died at its crash point.
CRASHED = 86
#: The statement that writes a round's charge row, in the reservation and the settlement.
WRITES = {"reserve": "INSERT INTO charges", "settle": "UPDATE charges"}
CONFIDENT: dict[str, Any] = {
    "num_classes": 10,
    "input_shape": [4],
    "mechanism": {"name": "robust-confident-gnmax", "sigma": 1.5, "threshold": 3.5, "sigma1": 2.0},
    "quorum": 1,
}
#: Answers every query: a round's charge is its worst case.
PLAIN: dict[str, Any] = {
    "num_classes": 10,
    "input_shape": [4],
    "mechanism": {"name": "gnmax", "sigma": 4.0},
    "quorum": 1,
}


@dataclass(frozen=True)
class Round:
    """One round as the guardian opened and settled it, as messages the hospital gets."""

    round_id: int
    work: bytes
    header: bytes
    settled: bytes
    #: The task's configuration (JSON), as the guardian defines it on the stream.
    config: str


def _die_at(engine: Engine, step: str, where: str) -> None:
    """Make this process die in ``step``'s transaction: right after the statement that
    writes its charge (``mid``) or at that transaction's commit (``commit``)."""
    wrote = False

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        nonlocal wrote
        if statement.lstrip().upper().startswith(WRITES[step].upper()):
            wrote = True
            if where == "mid":
                os._exit(CRASHED)

    @event.listens_for(engine, "commit")
    def _commit(conn: Any) -> None:
        if wrote and where == "commit":
            os._exit(CRASHED)


def _hospital(
    url: str,
    cap: float,
    registered: bytes,
    rounds: list[Round],
    crash: tuple[int, str] | None,
    votes: str,
) -> None:
    """The hospital's side of ``rounds``, dying at ``crash`` = (round index, point), point
    one of reserve-mid, reserve-commit, voted, settle-mid, settle-commit."""
    own = OwnBudget(NAME, Ledger(url), cap)
    own.welcome(guardian_pb2.Registered.FromString(registered))
    for i, rnd in enumerate(rounds):
        point = crash[1] if crash is not None and crash[0] == i else None
        if point is not None and point.startswith("reserve"):
            _die_at(own.ledger.engine, "reserve", point.split("-")[1])
        try:
            admit(
                own,
                guardian_pb2.RoundWork.FromString(rnd.work),
                common_pb2.Header.FromString(rnd.header),
                json.loads(rnd.config),
            )
        except VoteRefusedError:
            continue
        # The vote leaves only once the reservation is durable (services/answerer/party.py).
        with open(votes, "a") as f:
            f.write(f"{rnd.round_id}\n")
            f.flush()
            os.fsync(f.fileno())
        if point == "voted":
            os._exit(CRASHED)
        if point is not None and point.startswith("settle"):
            _die_at(own.ledger.engine, "settle", point.split("-")[1])
        own.settle(guardian_pb2.RoundSettled.FromString(rnd.settled))
    # A settlement is written with the next round's reservation, or when the party
    # stops (services/answerer/ledger_port.py): this one is written here.
    own.flush()
    own.ledger.close()


def _run_hospital(
    url: str,
    cap: float,
    registered: bytes,
    rounds: list[Round],
    crash: tuple[int, str] | None,
    votes: Path,
) -> int:
    # Each hospital a fresh process, forked from multiprocessing's server, which has
    # imported this module once (a spawned one imported it again each time: ~5 s of CPU).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    proc = ctx.Process(target=_hospital, args=(url, cap, registered, rounds, crash, str(votes)))
    proc.start()
    proc.join(timeout=300)
    if proc.exitcode is None:
        proc.kill()
        pytest.fail("the hospital's process did not end")
    return int(proc.exitcode)


class Guardian:
    """The guardian's ledger, opening and settling rounds as its round engine does."""

    def __init__(self, directory: Path, config: dict[str, Any]) -> None:
        self.ledger = Ledger(str(directory / "guardian.db"), signer=Ed25519PrivateKey.generate())
        self.ledger.register_party(NAME, 1e6, teachers=1)
        self.config = config
        self.ledger.create_task("t", config)
        self.mech = from_config(config["mechanism"], config["num_classes"])
        self.rng = np.random.default_rng(7)

    def registered(self) -> bytes:
        return budgets.registered(self.ledger, NAME).SerializeToString()

    def round(self, batch: int = 16) -> Round:
        """Reserve a round, release it and commit what it released (some queries
        unanswered where the mechanism has a threshold)."""
        key = f"k{self.ledger.last_round() + 1}"
        res = self.ledger.reserve(
            key, "t", "student", batch, {NAME: self.mech.worst_case(batch)},
            mechanism=self.mech.name, quorum=1,
        )  # fmt: skip
        work = guardian_pb2.RoundWork(
            round_id=res.round_id,
            queries=common_pb2.QueryBatch(
                recipe=common_pb2.Recipe(generator="gaussian", count=batch, shape=[4])
            ),
            mechanism=serde.mechanism_to_proto(self.mech),
            vote_weight=1.0,
        )
        header = common_pb2.Header(
            protocol_version=PROTOCOL_VERSION, task="t", config_hash=config_hash(self.config)
        )
        answered = (
            self.rng.random(batch) < 0.5 if self.mech.confident else np.ones(batch, dtype=bool)
        )
        self.ledger.release(res.round_id)
        self.ledger.commit(
            res.round_id, {NAME: self.mech.event(answered)}, outcome=budgets.outcome(answered)
        )
        settled = budgets.settlement_of(self.ledger, NAME, res.round_id)
        assert settled is not None
        return Round(
            res.round_id,
            work.SerializeToString(),
            header.SerializeToString(),
            settled.SerializeToString(),
            canonical_json(self.config),
        )


def _voted(votes: Path) -> list[int]:
    return [int(x) for x in votes.read_text().split()] if votes.exists() else []


def _verified(guardian: Ledger, own: Ledger) -> None:
    """Both audit chains and every head the hospital kept check (``capc audit verify``)."""
    report = verify(guardian, {NAME: own})
    assert report.ok, report.problems
    assert report.heads_checked >= 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "point", ["reserve-mid", "reserve-commit", "voted", "settle-mid", "settle-commit", None]
)
def test_a_crash_between_reservation_and_settlement_over_counts_never_under_counts(
    ledger_url: str, tmp_path: Path, point: str | None
) -> None:
    guardian = Guardian(tmp_path, CONFIDENT)
    # Shown at connection, before the rounds: a head older than any settlement's.
    registered = guardian.registered()
    first = guardian.round()
    after_first = guardian.ledger.spent_loss(NAME)
    second = guardian.round()
    votes = tmp_path / "votes"
    crash = None if point is None else (1, point)
    code = _run_hospital(ledger_url, 1e4, registered, [first, second], crash, votes)
    assert code == (0 if point is None else CRASHED)
    # The hospital restarts on the same ledger.
    own = OwnBudget(NAME, Ledger(ledger_url), 1e4)
    mine = own.ledger.spent_loss(NAME)
    worst = own.ledger.accounting.filter_cost(guardian.mech.worst_case(16))
    record = own.ledger.round_charges(first.round_id)
    assert record is not None
    if point in ("reserve-mid", "reserve-commit"):
        # Died before its reservation was durable: it never voted, and holds nothing for
        # the round (the guardian, which got no vote, would charge it nothing either).
        assert _voted(votes) == [first.round_id]
        assert own.ledger.round_charges(second.round_id) is None
        # The first round's settlement went in that transaction: it is lost with it, and
        # the first round stays reserved at its worst case (an over-count) ...
        assert record.state.value == "reserved" and own.open_rounds() == [first.round_id]
        np.testing.assert_allclose(mine, worst, rtol=1e-9)
        assert (mine > after_first).all()
        _verified(guardian.ledger, own.ledger)
        # ... until the guardian says again how it ended (the heartbeat asks).
        assert own.settle(guardian_pb2.RoundSettled.FromString(first.settled))
        assert not own.settle(guardian_pb2.RoundSettled.FromString(second.settled))
        own.flush()
        assert own.open_rounds() == []
        np.testing.assert_allclose(own.ledger.spent_loss(NAME), after_first, rtol=1e-9)
        _verified(guardian.ledger, own.ledger)
        return
    assert record.state.value == "committed"
    assert _voted(votes) == [first.round_id, second.round_id]
    charged = guardian.ledger.spent_loss(NAME)
    # Never below what the guardian charged for the rounds it voted in.
    assert (mine >= charged * (1 - 1e-12)).all()
    if point is None:
        np.testing.assert_allclose(mine, charged, rtol=1e-9)
        assert own.open_rounds() == []
        assert not own.settle(guardian_pb2.RoundSettled.FromString(second.settled))
    else:
        # Died before its settlement was durable: the round stays reserved at its worst
        # case, above what it cost (some queries went unanswered).
        assert own.open_rounds() == [second.round_id]
        np.testing.assert_allclose(mine, after_first + worst, rtol=1e-9)
        assert (mine > charged).all()
        _verified(guardian.ledger, own.ledger)
        # Told again how the round ended (its heartbeat asks), it settles it exactly.
        assert own.settle(guardian_pb2.RoundSettled.FromString(second.settled))
        assert own.open_rounds() == []
        own.flush()
        np.testing.assert_allclose(own.ledger.spent_loss(NAME), charged, rtol=1e-9)
    _verified(guardian.ledger, own.ledger)


@pytest.mark.slow
def test_a_hospital_past_its_cap_never_votes_across_crashes(
    ledger_url: str, tmp_path: Path
) -> None:
    guardian = Guardian(tmp_path, PLAIN)
    registered = guardian.registered()
    rounds = [guardian.round() for _ in range(4)]
    acc, delta = guardian.ledger.accounting, guardian.ledger.delta
    worst = acc.filter_cost(guardian.mech.worst_case(16))
    two, three = acc.spent(2 * worst, delta).epsilon, acc.spent(3 * worst, delta).epsilon
    cap = (two + three) / 2  # two rounds' worst case fit, a third does not
    votes = tmp_path / "votes"
    # Dies after voting in the first round, before hearing how it ended; restarted, it
    # votes in the second and dies the same way; restarted again, it is offered the rest.
    assert _run_hospital(ledger_url, cap, registered, rounds, (0, "voted"), votes) == CRASHED
    assert _run_hospital(ledger_url, cap, registered, rounds[1:], (0, "voted"), votes) == CRASHED
    assert _run_hospital(ledger_url, cap, registered, rounds[2:], None, votes) == 0
    assert _voted(votes) == [rounds[0].round_id, rounds[1].round_id]
    own = OwnBudget(NAME, Ledger(ledger_url), cap)
    # Both reservations survived the crashes and kept the cap.
    assert own.open_rounds() == [rounds[0].round_id, rounds[1].round_id]
    assert own.ledger.budget(NAME).spent <= cap
    for rnd in rounds[:2]:
        assert own.settle(guardian_pb2.RoundSettled.FromString(rnd.settled))
    np.testing.assert_allclose(own.ledger.spent_loss(NAME), 2 * worst, rtol=1e-9)
    # Settled at their worst case, the two rounds still leave no room for a third.
    with pytest.raises(VoteRefusedError) as refused:
        admit(
            own,
            guardian_pb2.RoundWork.FromString(rounds[3].work),
            common_pb2.Header.FromString(rounds[3].header),
            json.loads(rounds[3].config),
        )
    assert refused.value.budget
    _verified(guardian.ledger, own.ledger)


def test_the_beat_survives_a_ledger_error_and_the_round_is_settled_again(
    tmp_path: Path,
) -> None:
    """The party's periodic beat (services/answerer/party.py ``Beat``) meets a ledger that
    fails the write of a held settlement: it sends nothing false, stays due, and its next
    step reports the round as still open (an over-count) and names it in the heartbeat;
    the guardian's settlement sent again then settles it, and the report agrees with the
    guardian's ledger."""
    guardian = Guardian(tmp_path, PLAIN)
    rnd = guardian.round()
    own = OwnBudget(NAME, Ledger(str(tmp_path / "own.db")), 1e6)
    own.welcome(guardian_pb2.Registered.FromString(guardian.registered()))
    admit(
        own,
        guardian_pb2.RoundWork.FromString(rnd.work),
        common_pb2.Header.FromString(rnd.header),
        json.loads(rnd.config),
    )
    assert own.settle(guardian_pb2.RoundSettled.FromString(rnd.settled))
    out: BoundedBuffer[guardian_pb2.PartyMessage] = BoundedBuffer(16)
    beat = Beat(NAME, own, out)
    beat.report_due.set()
    failing = True

    @event.listens_for(own.ledger.engine, "before_cursor_execute")
    def _fail(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if failing and statement.lstrip().upper().startswith(WRITES["settle"].upper()):
            raise OperationalError(statement, None, Exception("disk I/O error"))

    def sent() -> list[guardian_pb2.PartyMessage]:
        got: list[guardian_pb2.PartyMessage] = []
        while True:
            try:
                msg = out.get_nowait()
            except queue.Empty:
                return got
            assert msg is not None
            got.append(msg)

    beat.step(beat.last_heartbeat)  # no heartbeat due yet
    assert sent() == [] and beat.report_due.is_set(), "a failed write sends no report"
    assert own.ledger.open_rounds() == [rnd.round_id], "the reservation still counts"

    failing = False
    beat.step(beat.last_heartbeat + HEARTBEAT_S)
    report, heartbeat = sent()
    assert report.report.open_rounds == 1 and report.report.through_round < rnd.round_id
    assert report.report.epsilon_spent > 0, "the round's worst case is counted"
    assert list(heartbeat.heartbeat.open_rounds) == [rnd.round_id], "asked for again"
    assert not beat.report_due.is_set()

    # The guardian answers the heartbeat with the settlement again (budgets.send_settlements).
    assert own.settle(guardian_pb2.RoundSettled.FromString(rnd.settled))
    beat.report_due.set()
    beat.step(beat.last_heartbeat)
    (again,) = sent()
    assert again.report.open_rounds == 0 and again.report.through_round == rnd.round_id
    np.testing.assert_allclose(
        list(again.report.settled_loss),
        guardian.ledger.settled_loss(NAME, rnd.round_id),
        rtol=1e-9,
    )
    own.ledger.close()
