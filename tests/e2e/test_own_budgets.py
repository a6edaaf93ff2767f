"""Hospitals own their budgets, end to end: guardian, four hospitals, student and gateway
as separate processes over mutual TLS.

- The guardian holds no larger cap for a hospital than the hospital set itself.
- A hospital whose cap the guardian's ledger was made to forget (its database rewritten)
  still stops voting at its own cap; the guardian charges it nothing for the rounds it
  refused, and both ledgers agree to 1e-9.
- The admin view (REST, metrics) shows both ledgers per hospital and flags a divergence.
- ``capc audit verify`` names the first entry of a rewritten history.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from capc.privacy.accountants import GaussianDp
from services.common import pki, tls
from services.common.ledger import Ledger
from services.common.ledger.audit import load_key
from services.local import ROOT, LocalConsortium
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc
from tests.e2e import tamper
from tests.e2e.jobs import assert_ledgers_agree

PARTIES = 4
BATCH = 8
CEILING = 1e6  # what the guardian's operator registers for every hospital


def _cap0() -> float:
    """Hospital 0's own cap: about two rounds' worst case of the task (the rest: plenty)."""
    cfg = LocalConsortium(Path("unused")).task_config
    gdp = GaussianDp()  # the ledgers' default accountant
    return gdp.spent(gdp.cost(cfg.mechanism.worst_case(int(2.5 * BATCH))), 1e-5).epsilon


CAPS = [_cap0(), 1e4, 1e4, 1e4]


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    c = LocalConsortium(
        tmp_path_factory.mktemp("own-budgets"),
        parties=PARTIES,
        epochs=1,
        epsilon_caps=CAPS,
        registered_caps=[CEILING] * PARTIES,
    )
    with c:
        c.start_student()
        c.start_gateway()
        yield c


def admin_stub(c: LocalConsortium) -> guardian_pb2_grpc.GuardianHubStub:
    return guardian_pb2_grpc.GuardianHubStub(
        tls.secure_channel(
            f"127.0.0.1:{c.port}",
            tls.TLSFiles.in_dir(c.pki_dir, "gateway"),
            "localhost",
            role="guardian",
        )
    )


def parties(c: LocalConsortium) -> dict[str, guardian_pb2.PartyStatus]:
    reply = admin_stub(c).ListParties(
        guardian_pb2.ListPartiesRequest(header=common_pb2.Header(protocol_version=2)), timeout=30
    )
    return {p.name: p for p in reply.parties}


def test_the_guardian_holds_each_hospitals_own_cap(consortium: LocalConsortium) -> None:
    seen = parties(consortium)
    for i, cap in enumerate(CAPS):
        p = seen[f"hospital-{i}"]
        assert (p.epsilon_cap, p.declared_cap, p.registered_cap) == (cap, cap, CEILING)
    audit = admin_stub(consortium).ListAudit(
        guardian_pb2.ListAuditRequest(header=common_pb2.Header(protocol_version=2), limit=200),
        timeout=30,
    )
    declared = {e.actor for e in audit.entries if e.action == "declare_cap"}
    assert declared == {f"hospital-{i}" for i in range(PARTIES)}, "audited under each identity"
    assert audit.chain_valid and audit.head.signature and audit.audit_public_key


def test_the_gateways_admin_cannot_raise_a_hospitals_cap(consortium: LocalConsortium) -> None:
    """The querier-side gateway's admin once raised hospital-a's cap from 8 to 1e6."""
    token = consortium.token("admin", "querier-admin")
    ctx = ssl.create_default_context(cafile=consortium.ca)
    with httpx.Client(verify=ctx, headers={"Authorization": f"Bearer {token}"}) as http:
        r = http.put(
            consortium.gateway_url + "/v1/admin/parties/hospital-0/cap",
            json={"epsilon_cap": CEILING},
        )
        assert r.status_code in (404, 405), r.text
        budgets = {
            b["party"]: b
            for b in http.get(consortium.gateway_url + "/v1/admin/budgets").json()["budgets"]
        }
    assert budgets["hospital-0"]["epsilon_cap"] == CAPS[0]
    assert parties(consortium)["hospital-0"].epsilon_cap == CAPS[0]


def test_a_hospital_stops_at_its_own_cap_whatever_the_guardians_ledger_says(
    consortium: LocalConsortium,
) -> None:
    # The guardian's ledger is rewritten behind the hospital's back: hospital-0's cap
    # there becomes a million, as if it had never declared its own.
    guardian = Ledger(consortium.db, delta=None, migrate=False)
    with guardian.engine.begin() as conn:
        conn.execute(
            text("UPDATE parties SET epsilon_cap = :c, declared_cap = NULL WHERE name = :n"),
            {"c": CEILING, "n": "hospital-0"},
        )
    assert guardian.budget("hospital-0").cap == CEILING
    student = consortium.student()
    results = []
    try:
        for k in range(10):
            results.append(student.label_batch(consortium.queries[k * BATCH : (k + 1) * BATCH]))
    finally:
        student.close()
    assert any("hospital-0" in r.parties for r in results), "it voted while it had room"
    # Its refusals are in the guardian's audit log under its identity; its words apart.
    # A round it sat out for lateness (a loaded machine) is not a refusal, so the rounds
    # are told apart by id, not by position.
    refused = [e for e in guardian.audit_entries(limit=500) if e.action == "party_refused_budget"]
    refused_rounds = {int(str(e.detail["round"])) for e in refused}
    assert refused_rounds, "it refused past its cap"
    assert not any("hospital-0" in r.parties for r in results if r.round_id in refused_rounds)
    # A vote after a refusal is allowed (issue 41, item 7): the refused round's work can
    # arrive before the previous round's settlement, whose worst case then still counts;
    # once settled at its smaller actual charge, a later round may fit. The invariant is
    # that its own spend never passes its own cap: both ledgers agree, within it.
    assert all(len(r.parties) >= 3 for r in results), "the other hospitals carried the rounds"
    assert_ledgers_agree(consortium)
    own = Ledger(consortium.party_ledger(0), delta=None, migrate=False)
    assert 0 < own.budget("hospital-0").spent <= CAPS[0]
    assert guardian.budget("hospital-0").spent <= CAPS[0]
    assert all(e.actor == "hospital-0" and "past its cap" in (e.note or "") for e in refused)


def test_the_admin_view_shows_both_ledgers_and_flags_a_divergence(
    consortium: LocalConsortium,
) -> None:
    token = consortium.token("admin", "data-office")
    scraper = consortium.token("metrics", "prometheus")
    ctx = ssl.create_default_context(cafile=consortium.ca)
    url = consortium.gateway_url
    with httpx.Client(verify=ctx, headers={"Authorization": f"Bearer {token}"}) as http:

        def views() -> dict[str, Any]:
            body = http.get(url + "/v1/admin/budgets").json()
            return {b["party"]: b for b in body["budgets"]}

        # Its own round (the test may run alone): hospital-1 spends something to lower.
        student = consortium.student()
        try:
            for _ in range(10):
                if "hospital-1" in student.label_batch(consortium.queries[:BATCH]).parties:
                    break
        finally:
            student.close()

        def caught_up(v: dict[str, Any]) -> bool:
            # "agree" alone also holds for a report sent before the rounds settled
            # (both sides through round 0); wait for each report of every settled round.
            own = v["own_ledger"]
            return bool(
                own["state"] == "agree"
                and own["open_rounds"] == 0
                and own["epsilon_spent"] == pytest.approx(v["epsilon_spent"], rel=1e-9)
            )

        deadline = time.monotonic() + 120
        while not all(caught_up(v) for v in views().values()):
            assert time.monotonic() < deadline, views()
            time.sleep(0.5)
        before = views()
        assert before["hospital-0"]["own_ledger"]["epsilon_spent"] == pytest.approx(
            before["hospital-0"]["epsilon_spent"], rel=1e-9
        )
        # Someone lowers hospital-1's spend in the guardian's database.
        guardian = Ledger(consortium.db, delta=None, migrate=False)
        real = guardian.spent_loss("hospital-1")
        assert float(np.sum(real)) > 0, "hospital-1 voted in a round: its spend can be lowered"
        with guardian.engine.begin() as conn:
            conn.execute(
                text("UPDATE party_spend SET loss = :l WHERE party = 'hospital-1'"),
                {"l": json.dumps((real / 2).tolist())},
            )
        after = views()
        assert after["hospital-1"]["own_ledger"]["state"] == "diverged"
        assert after["hospital-1"]["own_ledger"]["gap"] < 0
        assert after["hospital-2"]["own_ledger"]["state"] == "agree"
        metrics = httpx.get(
            url + "/metrics", headers={"Authorization": f"Bearer {scraper}"}, verify=ctx
        ).text
        assert 'capc_party_ledgers_diverged{party="hospital-1"} 1.0' in metrics
        with guardian.engine.begin() as conn:
            conn.execute(
                text("UPDATE party_spend SET loss = :l WHERE party = 'hospital-1'"),
                {"l": json.dumps(real.tolist())},
            )
        assert views()["hospital-1"]["own_ledger"]["state"] == "agree"


def verify(c: LocalConsortium, ledger: str) -> subprocess.CompletedProcess[str]:
    hospitals = [
        a for i in range(c.parties) for a in ("--party-ledger", f"hospital-{i}={c.party_ledger(i)}")
    ]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "services.commands.cli",
            "audit",
            "verify",
            "--ledger",
            ledger,
            *hospitals,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_audit_verify_names_the_first_entry_of_a_rewritten_history(
    consortium: LocalConsortium, tmp_path: Path
) -> None:
    ok = verify(consortium, tamper.snapshot(consortium.db, tmp_path / "now.db"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ok: every entry is signed and every kept head matches" in ok.stdout
    copy = Ledger(tamper.snapshot(consortium.db, tmp_path / "a.db"), delta=None, migrate=False)
    target = next(
        e.seq for e in reversed(copy.audit_entries(limit=1000)) if e.action == "declare_cap"
    )
    # Someone with the database but not the key rewrites who declared a cap.
    tamper.rewrite(copy.url, target, "gateway")
    bad = verify(consortium, copy.url)
    assert bad.returncode == 1, bad.stdout
    assert f"FIRST BAD ENTRY: guardian audit entry {target}: its signature does not match" in (
        bad.stdout
    )
    # A guardian that rewrites its own history and signs it again: the heads the
    # hospitals kept still disagree with it.
    resigned = tamper.snapshot(consortium.db, tmp_path / "b.db")
    key = load_key(pki.audit_key_path(consortium.pki_dir, "guardian"))
    tamper.rewrite(resigned, target, "gateway", key=key)
    bad = verify(consortium, resigned)
    assert bad.returncode == 1, bad.stdout
    first = bad.stdout.split("FIRST BAD ENTRY: ", 1)[1].splitlines()[0]
    assert "differs from the signed head hospital-" in first
    assert int(first.split("guardian audit entry ")[1].split()[0]) >= target
    # Entries removed from the end: the hospitals were shown them.
    cut = tamper.snapshot(consortium.db, tmp_path / "c.db")
    n = Ledger(cut, delta=None, migrate=False).audit_head().seq
    tamper.truncate(cut, n - 5)
    bad = verify(consortium, cut)
    assert bad.returncode == 1 and "missing" in bad.stdout, bad.stdout


def test_every_hospital_kept_the_head_of_every_round(consortium: LocalConsortium) -> None:
    for i in range(PARTIES):
        own = Ledger(consortium.party_ledger(i), delta=None, migrate=False)
        settled = [
            r for r in own.entries(party=f"hospital-{i}", limit=1000) if r.round_state != "aborted"
        ]
        heads = [e for e in own.audit_entries(limit=1000) if e.action == "guardian_head"]
        assert len(heads) >= len(settled) > 0
        assert np.all(np.diff([e.detail["seq"] for e in reversed(heads)]) >= 0)
