"""The guardian is SIGKILLed at random points during 50 rounds: no label is ever delivered uncharged."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from capc.mpc.channel import ProtocolError
from capc.round.ledger import RoundState
from services.common.ledger import Ledger
from services.local import LocalConsortium
from services.student.client import RoundResult
from tests.e2e.jobs import assert_ledgers_agree

ROUNDS = 50
#: Guardian kills the rounds go on through, at least (the killer stops at 6).
MIN_KILLS = 3
BATCH = 32


@pytest.fixture
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    # What is checked is the ledger, not the labels: teachers of one epoch (training four
    # hospitals' teachers for the default eight was most of this module's time).
    with LocalConsortium(
        tmp_path_factory.mktemp("crashes"), parties=4, share_timeout=10.0, epochs=1
    ) as c:
        yield c


@pytest.mark.slow
def test_random_guardian_kills_never_undercount(consortium: LocalConsortium) -> None:
    delivered: list[RoundResult] = []
    stop = threading.Event()
    kills = 0

    problems: list[str] = []

    def killer() -> None:
        nonlocal kills
        rng = random.Random(2026)
        while kills < 6 and not stop.wait(rng.uniform(1.5, 5.0)):
            consortium.kill_guardian()
            kills += 1
            try:
                consortium.start_guardian()
            except RuntimeError as err:
                problems.append(str(err))
                return

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    student = consortium.student()
    deadline = time.monotonic() + 400
    i = 0
    try:
        # Rounds go on until the killer struck MIN_KILLS times, however fast they run: the
        # kills come every 1.5 to 5 s, and fifty rounds may take less than that.
        while (
            (len(delivered) < ROUNDS or kills < MIN_KILLS)
            and time.monotonic() < deadline
            and not problems
        ):
            batch = consortium.queries[(i * BATCH) % 384 :][:BATCH]
            i += 1
            try:
                delivered.append(student.label_batch(batch))
            except (grpc.RpcError, ProtocolError, RuntimeError):
                student.close(timeout=1)
                student = consortium.student()
                time.sleep(0.5)
    finally:
        stop.set()
        thread.join()
        student.close(timeout=5)
    assert not problems, problems
    assert len(delivered) >= ROUNDS
    assert kills >= MIN_KILLS

    # One last crash and restart: recovery settles every round still open.
    consortium.kill_guardian()
    consortium.start_guardian()
    ledger = Ledger(consortium.db)
    assert ledger.count_rounds(RoundState.RESERVED) == 0
    assert ledger.count_rounds(RoundState.RELEASED) == 0
    mech = consortium.task_config.mechanism
    for r in delivered:
        assert ledger.round_state(r.round_id) == RoundState.COMMITTED
        acct = ledger.accounting
        owed = acct.spent(acct.cost(mech.event(r.labels >= 0)), ledger.delta).epsilon
        entries = ledger.entries(round_id=r.round_id)
        charged = {e.party: e.epsilon_alone for e in entries}
        for party in r.parties:
            assert charged[party] >= owed * (1 - 1e-9), (r.round_id, party)
    # Every party's running total covers at least the rounds the student saw, at every order.
    for b in ledger.budgets():
        assert np.isfinite(b.spent)
        seen = sum(
            (
                ledger.accounting.cost(mech.event(r.labels >= 0))
                for r in delivered
                if b.name in r.parties
            ),
            ledger.accounting.zero(),
        )
        assert (ledger.spent_loss(b.name) >= seen * (1 - 1e-9)).all(), b.name
    assert ledger.verify_audit() > 0
    # Each hospital's own ledger settled every round it voted in, across all the
    # guardian's crashes (asking again when it reconnected), and agrees with the guardian's.
    assert_ledgers_agree(consortium, timeout=180)
