"""Issue 33, attack (c): a student whose circuit input is out of range, through the real
round engine (guardian process, two ``capc answerer`` hospitals, mutual TLS).

The student adds an offset to its share of the histogram before the garbled circuit,
as a deviating student would to turn the mechanism's tests into comparisons of its
choosing. The circuit's checks see the reconstructed histogram out of range: the
round aborts with a clear error to the student, the guardian keeps it charged at
its reservation (its noisy output may have left) and audits a histogram_violation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from capc.mpc.mechanism_circuits import HistogramViolationError
from services.common.ledger.models import RoundState
from services.common.task import TaskConfig
from services.proto.capc.v1 import guardian_pb2
from services.student.client import StudentClient
from services.testbed.light import light_consortium, queries, wait_until


class OffsettingStudent(StudentClient):
    """A student that adds ``offset`` votes to class 0 of its share of every query."""

    offset: int = 1000

    def _check_votes(
        self, reply: guardian_pb2.OpenRoundReply, task: TaskConfig, batch: int
    ) -> tuple[guardian_pb2.VoteCheckReply, NDArray[np.uint64]]:
        check, total = super()._check_votes(reply, task, batch)
        total = total.copy()
        total[:, 0] += np.uint64(self.offset)
        return check, total


def test_an_offset_circuit_input_aborts_the_round_charged_at_its_reservation(
    tmp_path: Path,
) -> None:
    with light_consortium(tmp_path, parties=2) as c:
        c.start_guardian("--share-timeout", "20")
        c.wait_connected(c.start_parties(c.names), 2)
        honest = c.student()
        student = OffsettingStudent(
            honest.guardian, honest.files, honest.task, server_name="localhost", timeout=60
        )
        honest.close()
        with pytest.raises(HistogramViolationError, match="out of range on 8 queries") as err:
            student.label_batch(queries(8))
        assert "aborted" in str(err.value) and "reservation" in str(err.value)
        student.close()

        ledger = c.ledger()
        flagged = [e for e in ledger.audit_entries(200) if e.action == "histogram_violation"]
        assert len(flagged) == 1 and flagged[0].actor == "guardian"
        detail = flagged[0].detail
        round_id = detail["round"]
        assert isinstance(round_id, int) and detail["violations"] == 8
        assert detail["parties"] == c.names
        wait_until(lambda: ledger.round_state(round_id) == RoundState.COMMITTED, 30, "the commit")
        # Every party stays charged at its reservation: the worst case of 8 queries.
        worst = c.task_config.mechanism.worst_case(8, 1.0)
        acct = ledger.accounting
        maximum = acct.spent(acct.cost(worst), ledger.delta).epsilon
        charged = {e.party: e.epsilon_alone for e in ledger.entries(round_id=round_id)}
        assert set(charged) == set(c.names)
        assert all(eps == pytest.approx(maximum, rel=1e-9) for eps in charged.values())
