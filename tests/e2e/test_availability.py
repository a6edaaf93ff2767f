"""Availability under abuse, through the real processes (issue 34, item 3).

Guardian and answering parties run as ``capc`` processes over mutual TLS
(tests/e2e/light.py); the student's side is this test, acting as an honest
student (StudentClient) or a deviating one (raw stubs).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.guardian.ledger.models import RoundState
from tests.e2e.light import light_consortium, queries, wait_until

ROUND_TIMEOUT = 4.0


def test_a_round_never_computed_is_aborted_without_a_restart(tmp_path: Path) -> None:
    with light_consortium(tmp_path, parties=2) as c:
        guardian = c.start_guardian("--share-timeout", "2", "--round-timeout", str(ROUND_TIMEOUT))
        c.wait_connected(c.start_parties(c.names), 2)
        ledger = c.ledger()
        # A student opens a round and never runs its 2PC: both parties' budgets are held.
        stale = c.open_round_without_computing(queries(8))
        assert sorted(stale.included) == c.names
        assert ledger.round_state(stale.round_id) == RoundState.RESERVED
        held = {n: ledger.budget(n).spent for n in c.names}
        assert all(v > 0 for v in held.values())
        # An honest student's round meanwhile is computed, released and charged.
        student = c.student()
        done = student.label_batch(queries(8, seed=1))
        student.close()
        wait_until(
            lambda: ledger.round_state(done.round_id) == RoundState.COMMITTED, 30, "the commit"
        )
        # The stale round is aborted once its timeout passes; the guardian never restarted.
        wait_until(
            lambda: ledger.round_state(stale.round_id) == RoundState.ABORTED,
            ROUND_TIMEOUT + 10,
            "the stale round to be aborted",
        )
        assert guardian.popen.poll() is None
        assert not any("recovered after a restart" in line for line in guardian.lines)
        charged = {n: ledger.budget(n).spent for n in c.names}
        for n in c.names:
            alone = [e.epsilon_alone for e in ledger.entries(party=n)]
            assert len(alone) == 1  # only the computed round's charge is left
            assert charged[n] == pytest.approx(alone[0], rel=1e-9)
        # The released round stays charged after the timeout has passed for it too.
        time.sleep(ROUND_TIMEOUT + 1)
        assert ledger.round_state(done.round_id) == RoundState.COMMITTED
        assert {n: ledger.budget(n).spent for n in c.names} == charged
        assert ledger.verify_audit() > 0
