"""The CaPC loop as a product: a hospital labels its own records and retrains its model.

Three hospitals (separate processes, mutual TLS) vote with ensembles of two
last-layer teachers each. Hospital 0 also queries: the guardian operator binds the
certificate ``hospital-0-querier`` to hospital 0 (``capc guardian --querier``); the
hospital runs a student party under it (``capc student --hospital hospital-0``, and,
as an attacker would, WITHOUT ``--exclude``) and a gateway over it, and drives the
loop with ``capcctl`` as a separate process: its model is fitted on its few labelled
records alone, its unlabelled records are labelled by the others, its model is
fitted again on both and the gain is reported through REST.

Checked: the gain is reported and real; hospital 0's teachers never vote on its
queries (enforced by the guardian's binding: its budget pays nothing, the rounds'
participants leave it out, and a querier talking to the guardian directly cannot get
it back nor claim another hospital); its records are refused in the clear without
the explicit choice, and with it the guardian's signed audit log says so, per round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from capc.data.generators import Recipe
from capc.learning.diet import BodyConfig, pretrained_body, save_body
from capc.learning.simclr import PretrainConfig
from capc.round.ledger import RoundState
from services.common import tls
from services.common.ledger import Ledger
from services.gateway.tokens import TokenStore
from services.local import ROOT, LocalConsortium, free_port
from services.student.client import StudentClient

TASK = {
    "num_classes": 10,
    "input_shape": [1, 28, 28],
    "mechanism": {"name": "gnmax", "sigma": 0.5},
    "quorum": 2,
}
OWN, UNLABELLED, BATCH = 40, 600, 300
QUERIER, HOSPITAL = "hospital-0-querier", "hospital-0"


class Loop:
    """Hospital 0's querier and its gateway, started over the consortium."""

    def __init__(self, c: LocalConsortium, root: Path) -> None:
        x, y = c.queries, np.asarray(c.truth)
        self.truth = y[OWN : OWN + UNLABELLED]
        self.records = root / "own-unlabelled.npz"
        np.savez(self.records, x=x[OWN : OWN + UNLABELLED])
        test = (x[OWN + UNLABELLED :], y[OWN + UNLABELLED :])
        # The attack: the querier leaves out nobody itself; the guardian must.
        student_port = c.start_querier(0, (x[:OWN], y[:OWN]), test, exclude_self=False)
        self.db = str(root / "loop-gateway.db")
        self.port = free_port()
        c.serve_gateway("loop-gateway", student_port, self.port, self.db)
        self.consortium = c

    def capcctl(self, role: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``capcctl ARGS`` as a separate process against the hospital's gateway."""
        token = TokenStore(self.db).create(role, role, 1.0)[0]
        env = {
            **os.environ,
            "CAPC_URL": f"https://127.0.0.1:{self.port}",
            "CAPC_TOKEN": token,
            "CAPC_CA": str(self.consortium.ca),
            "PYTHONPATH": str(ROOT / "clients"),  # this tree's client, not an installed one
        }
        return subprocess.run(
            [sys.executable, "-m", "capc_client.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    root = tmp_path_factory.mktemp("capc-loop")
    config = BodyConfig(width=8, pool=1024, pretrain=PretrainConfig(steps=20, batch=64))
    body = pretrained_body(config, None, 10, lambda s: None, "cpu")
    save_body(root / "body.pt", body, config)
    with LocalConsortium(
        root / "consortium",
        parties=3,
        task=dict(TASK),
        body=root / "body.pt",
        teachers=[2, 2, 2],
        epsilon_cap=1e6,
        held_out=1200,
        queriers={QUERIER: HOSPITAL},
    ) as c:
        yield c


@pytest.fixture(scope="module")
def loop(consortium: LocalConsortium, tmp_path_factory: pytest.TempPathFactory) -> Loop:
    return Loop(consortium, tmp_path_factory.mktemp("loop"))


def audit(c: LocalConsortium, action: str) -> list[dict[str, object]]:
    """The guardian's audit entries of ``action`` (chain checked), with their actor."""
    ledger = Ledger(c.db)
    try:
        ledger.verify_audit()
        entries = ledger.audit_entries(limit=10_000)
    finally:
        ledger.close()
    return [{"actor": e.actor, **e.detail} for e in entries if e.action == action]


def committed(c: LocalConsortium, rounds: list[int]) -> set[int]:
    """Those of ``rounds`` that were computed and charged (not aborted and retried)."""
    ledger = Ledger(c.db)
    try:
        return {r for r in rounds if ledger.round_state(r) == RoundState.COMMITTED}
    finally:
        ledger.close()


def spent(c: LocalConsortium) -> dict[str, np.ndarray]:
    ledger = Ledger(c.db)
    try:
        return {f"hospital-{i}": ledger.spent_loss(f"hospital-{i}") for i in range(c.parties)}
    finally:
        ledger.close()


def test_clear_records_are_refused_without_the_explicit_choice(loop: Loop) -> None:
    refused = loop.capcctl("analyst", "jobs", "submit", "--file", str(loop.records), "--quiet")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "reveal_records_to_answerers" in refused.stderr, refused.stderr
    assert "encrypted" in refused.stderr
    assert audit(loop.consortium, "clear_records") == []
    # Revealing is an admin's choice: an analyst's token cannot make it.
    analyst = loop.capcctl(
        "analyst", "jobs", "submit", "--file", str(loop.records), "--reveal-records-to-answerers"
    )
    assert analyst.returncode == 1 and "needs the admin role" in analyst.stderr, analyst.stderr
    assert audit(loop.consortium, "clear_records") == []


def test_a_hospital_improves_its_own_model_through_capcctl(loop: Loop) -> None:
    c = loop.consortium
    before_spend = spent(c)
    run = loop.capcctl(
        "admin",
        "loop",
        "run",
        "--records",
        str(loop.records),
        "--reveal-records-to-answerers",
        "--batch-size",
        str(BATCH),
        "--wait",
        "--json",
        "--quiet",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    print(
        f"CaPC loop via capcctl: hospital 0's model {report['accuracy_before']:.3f} -> "
        f"{report['accuracy_after']:.3f} (gain {report['gain']:+.3f}), "
        f"{report['labels_bought']} labels, eps by party {report['epsilon_by_party']}"
    )
    assert report["hospital"] == HOSPITAL and report["bound_hospital"] == HOSPITAL
    assert report["before"]["examples"] == OWN
    assert report["after"]["examples"] == OWN + UNLABELLED
    assert report["gain"] == pytest.approx(report["accuracy_after"] - report["accuracy_before"])
    assert report["gain"] > 0.03
    assert report["labels_bought"] == UNLABELLED == report["records_revealed"]
    # The others paid for it; hospital 0 did not, though its querier never excluded it.
    assert set(report["epsilon_by_party"]) == {"hospital-1", "hospital-2"}
    assert report["epsilon_spent"] > 0
    after_spend = spent(c)
    np.testing.assert_array_equal(after_spend[HOSPITAL], before_spend[HOSPITAL])
    for name in ("hospital-1", "hospital-2"):
        assert (after_spend[name] > before_spend[name]).any()
    # Every round the querier opened (a retried one included) left hospital 0 out.
    reserves = [r for r in audit(c, "reserve") if r["actor"] == QUERIER]
    assert len(reserves) >= UNLABELLED // BATCH
    assert all(HOSPITAL not in r["included"] for r in reserves)  # type: ignore[operator]
    # Audited: querier Q sent N of its own records in the clear in round R.
    clear = audit(c, "clear_records")
    assert {r["round"] for r in clear} == {r["round"] for r in reserves}
    assert all(r["actor"] == QUERIER and r["hospital"] == HOSPITAL for r in clear)
    # ... and by whose choice: the gateway token's holder (capcctl's token is "admin").
    assert all(str(r["revealed_by"]).endswith("(admin, admin)") for r in clear)
    done = committed(c, [int(r["round"]) for r in clear])  # type: ignore[call-overload]
    assert sum(int(r["records"]) for r in clear if r["round"] in done) == UNLABELLED  # type: ignore[call-overload]
    shown = loop.capcctl("analyst", "loop", "show")
    assert shown.returncode == 0 and "gain +" in shown.stdout, shown.stdout + shown.stderr


def test_the_guardian_enforces_the_binding_against_a_deviating_querier(loop: Loop) -> None:
    """A querier that talks to the guardian directly (no student party to refuse it)."""
    c = loop.consortium
    files = tls.TLSFiles.in_dir(c.pki_dir, QUERIER)

    def client(hospital: str) -> StudentClient:
        return StudentClient(
            c.address, files, c.task_config, server_name="localhost", hospital=hospital
        )

    before = spent(c)
    recipe = Recipe("gaussian", seed=7, start=0, count=8, shape=(1, 28, 28))
    attacker = client("")
    try:
        # Synthetic queries, no exclusion asked for: hospital 0 still sits out.
        result = attacker.label_recipe(recipe)
        assert HOSPITAL not in result.parties and len(result.parties) == 2
        # Its own records in the clear without saying so: refused by the guardian.
        with pytest.raises(grpc.RpcError) as refused:
            attacker.label_batch(c.queries[:8])
        assert "reveal_records" in str(refused.value.details())
    finally:
        attacker.close(timeout=1)
    liar = client("hospital-2")
    try:
        with pytest.raises(grpc.RpcError) as claimed:
            liar.label_recipe(recipe)
        assert "bound it to hospital-0" in str(claimed.value.details())
    finally:
        liar.close(timeout=1)
    np.testing.assert_array_equal(spent(c)[HOSPITAL], before[HOSPITAL])
