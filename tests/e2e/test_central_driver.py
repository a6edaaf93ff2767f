"""The central driver and the networked services are one protocol: the same labels, bit
for bit, with the same noise, and the same charges.

A light consortium (guardian and three answering parties as separate processes over
mutual TLS) labels batches with the guardian's test-only noise seed; the central
driver (capc.round.central) runs the same cores in one process, with the same task,
the same teachers and its guardian's noise from the same seed, through the real
garbled circuit. Labels and every party's charge must agree exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from capc.models import load_teacher
from capc.privacy.randomness import SecureRandom
from capc.round.central import CentralDriver
from capc.round.ledger import RoundState
from services.testbed.light import TASK, light_consortium, queries, wait_until

NOISE_SEED = "central-driver-e2e"
BATCHES = (8, 5, 11)
ROBUST = {"name": "robust-confident-gnmax", "sigma": 3.0, "threshold": 2.5, "sigma1": 2.0}


@pytest.mark.parametrize(
    "task", [TASK, {**TASK, "mechanism": ROBUST}], ids=["gnmax", "robust-confident-gnmax"]
)
def test_the_central_driver_and_the_services_give_the_same_labels_and_charges(
    tmp_path: Path, task: dict[str, Any]
) -> None:
    with light_consortium(tmp_path, parties=3, task=task) as c:
        c.start_guardian("--noise-seed", NOISE_SEED, "--insecure-dev")
        c.wait_connected(c.start_parties(c.names), 3)
        student = c.student()
        batches = [queries(b, seed=k) for k, b in enumerate(BATCHES)]
        try:
            networked = [student.label_batch(x) for x in batches]
        finally:
            student.close()
        assert all(r.parties == tuple(c.names) for r in networked)
        ledger = c.ledger()
        wait_until(
            lambda: ledger.count_rounds(RoundState.COMMITTED) == len(BATCHES), 30, "the commits"
        )

        # Every party votes with the one checkpoint the consortium's parties load.
        teacher = load_teacher(c.model)
        driver = CentralDriver(
            c.task_config,
            dict.fromkeys(c.names, c.cap),
            rng=SecureRandom.from_seed(NOISE_SEED),
            accounting=ledger.accounting,
            delta=ledger.delta,
        )
        central = [driver.label({p: teacher.predict(x)[:, None] for p in c.names}) for x in batches]
        for net, mine in zip(networked, central, strict=True):
            np.testing.assert_array_equal(mine.labels, net.labels)
            assert mine.parties == net.parties
        labels = np.concatenate([r.labels for r in central])
        # Teeth: the noise decides labels (another seed labels otherwise) ...
        other = CentralDriver(
            c.task_config,
            dict.fromkeys(c.names, c.cap),
            rng=SecureRandom.from_seed("another seed"),
            mode="oracle",
        )
        votes = [{p: teacher.predict(x)[:, None] for p in c.names} for x in batches]
        again = np.concatenate([other.label(v).labels for v in votes])
        assert not np.array_equal(labels, again)
        # ... and both ledgers charged every party the same, the parties' own ledgers too.
        for p in c.names:
            np.testing.assert_allclose(
                driver.ledger.spent_loss(p), ledger.spent_loss(p), rtol=1e-12, atol=0
            )
            own = driver.parties[p].ledger
            assert own.open_rounds() == []
        if task["mechanism"]["name"] != "gnmax":
            answered = labels >= 0
            assert 0 < answered.sum() < len(labels)
