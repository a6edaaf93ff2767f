"""Deviating students through the real round engine (guardian process, ``capc answerer``
hospitals, mutual TLS).

Issue 33, attack (c): a student whose circuit input is out of range.

The student adds an offset to its share of the histogram before the garbled circuit,
as a deviating student would to turn the mechanism's tests into comparisons of its
choosing. The circuit's checks see the reconstructed histogram out of range: the
round aborts with a clear error to the student, the guardian keeps it charged at
its reservation (its noisy output may have left) and audits a histogram_violation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from numpy.typing import NDArray

from capc.mpc import validity
from capc.mpc.mechanism_circuits import HistogramViolationError
from capc.round.ledger import RoundState
from capc.round.student import StudentRound
from services.common import protocol
from services.common.ledger.disputes import Dispute
from services.proto.capc.v1 import guardian_pb2, guardian_pb2_grpc
from services.student.client import StudentClient
from services.testbed.light import light_consortium, queries, wait_until


class OffsettingStudent(StudentClient):
    """A student that adds ``offset`` votes to class 0 of its share of every query."""

    offset: int = 1000

    def _check_votes(self, rnd: StudentRound) -> NDArray[np.uint64]:
        total = super()._check_votes(rnd).copy()
        total[:, 0] += np.uint64(self.offset)
        return total


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


class _FramingStub:
    """The student's guardian stub, adding 1 (mod p) to its combined verifier share for
    ``student.frames``: that party's vote check fails although its vote is valid."""

    def __init__(self, stub: Any, student: FramingStudent) -> None:
        self._stub, self._student = stub, student

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    def CheckVotes(self, msg: guardian_pb2.VoteCheck, **kwargs: Any) -> Any:  # noqa: N802
        framed = guardian_pb2.VoteCheck()
        framed.CopyFrom(msg)
        combined = np.frombuffer(msg.combined, dtype="<u8").copy()
        i = list(msg.parties).index(self._student.frames)
        combined[i] = (int(combined[i]) + 1) % validity.P
        framed.combined = combined.astype("<u8").tobytes()
        return self._stub.CheckVotes(framed, **kwargs)


class FramingStudent(StudentClient):
    """A student that tampers with its verifier message to frame the hospital ``frames``."""

    frames = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        # The stub is duck-typed: every other call goes through unchanged.
        self._stub = cast(guardian_pb2_grpc.GuardianHubStub, _FramingStub(self._stub, self))


def test_a_student_that_frames_a_hospital_is_recorded_as_a_dispute(tmp_path: Path) -> None:
    """Issue 41, item 2: a student adds 1 to its verifier message for an honest hospital.
    Its vote is left out, but the guardian's audit log names a dispute between the student
    and that hospital, not the hospital as culprit; failures are counted per pair, and a
    querier failing with several hospitals (each failing with nobody else) points to the
    querier."""
    with light_consortium(tmp_path, parties=3) as c:
        c.start_guardian("--share-timeout", "20")
        c.wait_connected(c.start_parties(c.names), 3)
        honest = c.student()
        student = FramingStudent(
            honest.guardian, honest.files, honest.task, server_name="localhost", timeout=60
        )
        honest.close()
        ledger = c.ledger()
        results = []
        try:
            for k, framed in enumerate(["hospital-0", "hospital-1", "hospital-0"]):
                student.frames = framed
                result = student.label_batch(queries(4, seed=k))
                results.append(result)
                assert set(result.invalid) == {framed}, result.invalid
                assert sorted(result.parties) == sorted(set(c.names) - {framed})
                if k == 0:
                    # One failed check names no culprit: either side could have caused it.
                    assert ledger.disputes() == [
                        Dispute("student", "hospital-0", 1, 1, 1, "undetermined")
                    ]
        finally:
            student.close()

        entries = ledger.audit_entries(500)
        # No entry names a hospital as the actor of an invalid vote.
        assert not [e for e in entries if e.action == "invalid_vote"]
        disputes = [e for e in reversed(entries) if e.action == "dispute"]
        assert [
            (e.actor, e.detail["round"], e.detail["querier"], e.detail["party"], e.detail["check"])
            for e in disputes
        ] == [
            ("guardian", r.round_id, "student", framed, "vote_validity")
            for r, framed in zip(results, ["hospital-0", "hospital-1", "hospital-0"], strict=True)
        ]
        expected = [
            Dispute("student", "hospital-0", 2, 1, 2, "querier"),
            Dispute("student", "hospital-1", 1, 1, 2, "querier"),
        ]
        assert ledger.disputes() == expected
        # The operator's view (the admin RPC behind /v1/admin/audit and capcctl audit).
        reply = c.stub("gateway").ListAudit(
            guardian_pb2.ListAuditRequest(
                header=protocol.header(c.task_config.name, c.task_config.config_hash), limit=1
            ),
            timeout=30,
        )
        assert [
            (d.querier, d.party, d.failures, d.party_queriers, d.querier_parties, d.points_to)
            for d in reply.disputes
        ] == [
            (d.querier, d.party, d.failures, d.party_queriers, d.querier_parties, d.points_to)
            for d in expected
        ]
        # The framed hospital pays nothing for a round its vote was left out of.
        wait_until(
            lambda: all(ledger.round_state(r.round_id) == RoundState.COMMITTED for r in results),
            30,
            "the commits",
        )
        for r, framed in zip(results, ["hospital-0", "hospital-1", "hospital-0"], strict=True):
            charged = {
                e.party: e.epsilon_alone
                for e in ledger.entries(round_id=r.round_id)
                if e.kind == "charge"
            }
            assert charged.get(framed, 0.0) == 0.0, (framed, charged)
            assert all(charged[p] > 0 for p in c.names if p != framed), charged
