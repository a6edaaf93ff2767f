"""A DP-SGD training's one charge in the SQL ledger, on SQLite and PostgreSQL: charged
once per digest however many processes attest it at once, refused past the cap with
nothing written, audited in the hash chain (which still verifies)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from capc.privacy import accountants
from capc.privacy.dp_training import plan_training as plan
from capc.round.training import Attestation, TrainingCharge, TrainingRefusedError, file_digest
from services.common.ledger import Ledger

DELTA = 1e-5
GDP = accountants.make(accountants.DEFAULT_ACCOUNTANT)


def attestation(epsilon: float, file: bytes) -> Attestation:
    rec = plan(epsilon, DELTA, 40, clip=1.0, records=50)
    return Attestation((rec,), file_digest([file], [rec]))


def test_concurrent_attestations_of_one_digest_charge_once(ledger_url: str) -> None:
    ledger = Ledger(ledger_url, delta=DELTA)
    ledger.register_party("h1", 10.0)
    att = attestation(2.0, b"\x01" * 32)
    results: list[TrainingCharge] = []
    errors: list[BaseException] = []

    def charge() -> None:
        # Each thread its own Ledger object: separate connections, as separate processes.
        mine = Ledger(ledger_url, delta=DELTA, migrate=False)
        try:
            results.append(mine.charge_training("h1", att, actor="h1"))
        except BaseException as err:
            errors.append(err)
        finally:
            mine.close()

    threads = [threading.Thread(target=charge) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(r.charged for r in results) == 1
    np.testing.assert_allclose(ledger.spent_loss("h1"), GDP.filter_cost(att.event()), rtol=1e-12)
    assert [t.attestation for t in ledger.trainings("h1")] == [att]
    assert [e.action for e in ledger.audit_entries(limit=100)].count("dp_training") == 1
    assert ledger.verify_audit() >= 1


def test_a_training_past_the_cap_writes_nothing(ledger_url: str) -> None:
    ledger = Ledger(ledger_url, delta=DELTA)
    ledger.register_party("h1", 1.0)
    before = len(ledger.audit_entries(limit=100))
    with pytest.raises(TrainingRefusedError, match="past its cap"):
        ledger.charge_training("h1", attestation(3.0, b"\x01" * 32), actor="h1")
    assert not ledger.spent_loss("h1").any()
    assert ledger.trainings() == []
    assert len(ledger.audit_entries(limit=100)) == before
    # The budget read counts a charged training as spent.
    ledger.charge_training("h1", attestation(0.5, b"\x02" * 32), actor="h1")
    assert ledger.budget("h1").spent == pytest.approx(ledger.trainings("h1")[0].epsilon, rel=1e-9)


def test_the_budget_history_counts_the_training_first(ledger_url: str) -> None:
    from capc.privacy import events
    from capc.privacy.events import GaussianEvent

    ledger = Ledger(ledger_url, delta=DELTA)
    ledger.register_party("h1", 10.0)
    ledger.create_task("t", {"mechanism": "gnmax"})
    charge = ledger.charge_training("h1", attestation(1.0, b"\x01" * 32), actor="h1")
    cost = events.repeat(GaussianEvent(np.sqrt(2.0), 40.0), 10)
    res = ledger.reserve("k", "t", "student", 10, {"h1": cost}, mechanism="gnmax", quorum=1)
    ledger.release(res.round_id)
    ledger.commit(res.round_id, {"h1": cost})
    points = ledger.history()["h1"]
    assert [p[2] for p in points] == [0, res.round_id]  # the training, then the round
    assert points[0][1] == pytest.approx(charge.epsilon, rel=1e-9)
    assert points[-1][1] == pytest.approx(ledger.budget("h1").spent, rel=1e-9)
