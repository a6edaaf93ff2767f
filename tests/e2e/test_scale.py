"""One guardian, 200 connected hospitals, rounds that include them all (issue 34, item 6).

The hospitals are 200 answering parties with their own certificates and
mutual-TLS Connect streams, packed four processes to the machine
(services.testbed.light). Every round uses all 200; each party's ledger
entry matches an independent mu-GDP sum to 1e-9.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capc.round.ledger import RoundState
from services.common import protocol
from services.proto.capc.v1 import guardian_pb2
from services.testbed.light import TASK, light_consortium, queries, wait_until
from tests.e2e.jobs import gdp_epsilon

HOSPITALS = 200
PER_PROCESS = 50
BATCH = 32
ROUNDS = 3
SIGMA = 200.0  # 200 teachers: enough noise for a handful of epsilon after the rounds


@pytest.mark.slow
def test_two_hundred_hospitals_answer_every_round(tmp_path: Path) -> None:
    task = dict(TASK, mechanism={"name": "gnmax", "sigma": SIGMA})
    with light_consortium(tmp_path, parties=HOSPITALS, task=task) as c:
        c.start_guardian("--share-timeout", "120")
        groups = [c.names[i : i + PER_PROCESS] for i in range(0, HOSPITALS, PER_PROCESS)]
        procs = [c.start_parties(group) for group in groups]
        for proc, group in zip(procs, groups, strict=True):
            c.wait_connected(proc, len(group), timeout=400)
        reply = c.stub("gateway").ListParties(
            guardian_pb2.ListPartiesRequest(header=protocol.header()), timeout=30
        )
        assert sum(p.connected for p in reply.parties) == HOSPITALS
        student = c.student(timeout=300)
        rounds = [student.label_batch(queries(BATCH, seed=r)) for r in range(ROUNDS)]
        student.close()
        for r in rounds:
            assert len(r.parties) == HOSPITALS and (r.labels >= 0).all()
        ledger = c.ledger()
        wait_until(lambda: ledger.count_rounds(RoundState.COMMITTED) == ROUNDS, 60, "the commits")
        expected = gdp_epsilon(float(np.sqrt(2 * ROUNDS * BATCH / SIGMA**2)), 1e-5)
        for budget in ledger.budgets():
            assert budget.spent == pytest.approx(expected, rel=1e-9), budget.name
        assert ledger.verify_audit() > 0
