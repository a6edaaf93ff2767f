"""Issue 33, attack (a): one hospital votes 400 for class 7 out of its share.

Real processes: the guardian and two honest hospitals (``capc answerer``) over mutual
TLS, the deviating hospital an in-test party speaking the same gRPC protocol with its
own certificate, the student a real client. Before vote validity proofs were wired
in, the circuit's histogram check caught the stuffed ballot only by aborting the
whole round after its release, so every honest party paid its reservation (the
maximum); before the checks, every label was 7. Now the stuffed vote fails its
proof and is left out: the round runs on the honest votes and the deviating party
is named.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from capc.round.ledger import RoundState
from services.common.ledger import Ledger
from services.testbed.light import TASK, light_consortium, queries, wait_until
from tests.e2e.light import DeviatingParty, ballot_stuffing

# Ten classes, so that class 7 exists; a threshold far above what the two honest
# hospitals can reach (2 votes), so the honest histogram is never answered and its
# plaintext oracle is "not answered" everywhere, while 400 stuffed votes would be.
STUFFED = {
    **TASK,
    "num_classes": 10,
    "mechanism": {"name": "robust-confident-gnmax", "sigma": 20, "threshold": 200, "sigma1": 20},
}


def test_a_stuffed_ballot_is_left_out_named_and_not_paid_for_by_the_others(
    tmp_path: Path,
) -> None:
    with light_consortium(tmp_path, parties=3, task=STUFFED) as c:
        c.start_guardian("--share-timeout", "20")
        honest, mallory_name = c.names[:2], c.names[2]
        c.wait_connected(c.start_parties(honest), 2)
        mallory = DeviatingParty(c, mallory_name, ballot_stuffing(7, 400))
        student = c.student()
        try:
            result = student.label_batch(queries(16))
        finally:
            student.close()
        assert mallory.rounds == [result.round_id]
        # Not every label is 7: the plaintext oracle on the two honest votes, whose
        # counts (2 at most) stay far below the threshold, answers nothing.
        assert (result.labels == -1).all(), result.labels
        assert sorted(result.parties) == honest
        assert set(result.invalid) == {mallory_name}
        assert "validity proof" in result.invalid[mallory_name]

        ledger = c.ledger()
        wait_until(
            lambda: ledger.round_state(result.round_id) == RoundState.COMMITTED, 30, "the commit"
        )
        entries = ledger.entries(round_id=result.round_id)
        charged = {e.party: e.epsilon_alone for e in entries if e.kind == "charge"}
        # The deviating party's vote was not used: the guardian charges it nothing.
        assert charged.get(mallory_name, 0.0) == 0.0
        # The honest parties pay for what was released (nothing answered), not the
        # round's worst case, which an aborted-after-release round would charge.
        worst = c.task_config.mechanism.worst_case(16, 1.0)
        acct = ledger.accounting
        maximum = acct.spent(acct.cost(worst), ledger.delta).epsilon
        assert all(0 < charged[p] < 0.9 * maximum for p in honest), (charged, maximum)
        # The guardian's audit log names a dispute between the student and the party: a
        # failed check alone cannot tell which of the two deviated.
        flagged = [e for e in ledger.audit_entries(200) if e.action == "dispute"]
        assert [(e.detail["querier"], e.detail["party"]) for e in flagged] == [
            ("student", mallory_name)
        ]
        assert flagged[0].detail["round"] == result.round_id
        assert not [e for e in ledger.audit_entries(200) if e.action == "histogram_violation"]
        mallory.leave()
        # An honest round afterwards: no exclusion, labels as before.
        student = c.student()
        try:
            again = student.label_batch(queries(8, seed=1))
        finally:
            student.close()
        assert not again.invalid and sorted(again.parties) == honest
        np.testing.assert_array_equal(again.labels, -1)
        # Each honest hospital's own ledger charged itself what the guardian charged it.
        own = {
            n: Ledger(str(tmp_path / f"{n}-ledger.db"), delta=None, migrate=False) for n in honest
        }
        wait_until(
            lambda: not ledger.open_rounds() and not any(o.open_rounds() for o in own.values()),
            30,
            "both ledgers to settle",
        )
        for name, mine in own.items():
            np.testing.assert_allclose(
                mine.spent_loss(name), ledger.spent_loss(name), rtol=1e-9, atol=0, err_msg=name
            )
            mine.close()


def test_a_hospital_claiming_1024_teachers_is_refused_at_register(tmp_path: Path) -> None:
    """Issue 33's gap: a hospital's proofs hold it to the teacher count it declares, so a
    deviating one that declares 1,024 would cast 1,024 valid votes. The guardian's
    operator pins each hospital at one teacher (``capc guardian --register NAME=EPS:1``):
    the claim is refused at Register, audited under the hospital's identity, and the
    honest hospitals still connect and answer without it."""
    with light_consortium(tmp_path, parties=3) as c:
        c.start_guardian()
        honest, mallory_name = c.names[:2], c.names[2]
        with pytest.raises(grpc.RpcError) as err:
            DeviatingParty(c, mallory_name, ballot_stuffing(7, 1024), teachers=1024)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        details = str(err.value.details())
        assert "declared 1024 teachers, more than the 1" in details
        assert f"--register {mallory_name}=EPS:TEACHERS" in details
        ledger = c.ledger()
        refused = [e for e in ledger.audit_entries(50) if e.action == "refuse_teachers"]
        assert [(e.actor, e.detail["declared"], e.detail["pinned"]) for e in refused] == [
            (mallory_name, 1024, 1)
        ]
        assert ledger.budget(mallory_name).declared_cap is None  # it never got that far
        c.wait_connected(c.start_parties(honest), 2)
        student = c.student()
        try:
            result = student.label_batch(queries(4))
        finally:
            student.close()
        assert sorted(result.parties) == honest and not result.invalid
