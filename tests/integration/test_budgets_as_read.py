"""Budgets where users read them carry the full delta, (eps, delta + R 2^-40), with R the
rounds a party was asked to vote in, aborted ones included (docs/privacy.md); and a raised
cap is the hospital's declaration, audited with its reason.

The guardian hub runs over real gRPC with mutual TLS on a real ledger; the gateway app
reads it with its own certificate; capcctl runs its real commands against that app.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from capc.mpc.mechanism_circuits import MAX_CUTOFF_FAILURE, cutoff_failure
from capc.mpc.validity import MAX_CONVERSION_FAILURE, ValidityError, conversion_delta
from capc.privacy import events
from capc.privacy.events import GaussianEvent
from services.answerer.budget import CapRaiseError, OwnBudget
from services.common import pki, tls
from services.common.ledger import Ledger
from services.gateway.app import create_app
from services.gateway.backends import Backends
from services.gateway.tokens import TokenStore
from services.guardian import budgets
from services.guardian.hub import RunningServer, serve
from services.proto.capc.v1 import guardian_pb2

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients"))
from capc_client import cli as capcctl
from capc_client.sdk import Client

DELTA = 1e-5
#: hospital-a and hospital-b are each asked in 3 rounds: one charged to both, one
#: aborted, one that charges hospital-b nothing.
ASKED = 3


def full(spent: float) -> float:
    """The guarantee's delta of a party that spent ``spent`` in ASKED rounds: the noise
    cut-off's (delta + e^eps p) / (1 - p), then the ring conversion's ASKED 2^-40."""
    p = cutoff_failure(ASKED)
    return (DELTA + math.exp(spent) * p) / (1 - p) + ASKED * 2.0**-40


def cost(queries: int) -> events.DpEvent:
    return events.repeat(GaussianEvent(np.sqrt(2.0), 40.0), queries)


@pytest.fixture(scope="module")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    pki.init_ca(d, dev=True)
    for role, name in (("guardian", "guardian"), ("gateway", "gateway")):
        pki.issue(d, role, name, dev=True)
    return d


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Ledger:
    ledger = Ledger(str(tmp_path_factory.mktemp("ledger") / "ledger.db"), delta=DELTA)
    ledger.create_task("digits", {"classes": 10, "mechanism": "gnmax", "sigma": 40.0})
    for name in ("hospital-a", "hospital-b"):
        ledger.register_party(name, 8.0, teachers=1)
    both = {"hospital-a": cost(10), "hospital-b": cost(10)}
    first = ledger.reserve("r1", "digits", "student", 10, both, mechanism="gnmax", quorum=1)
    ledger.release(first.round_id)
    ledger.commit(first.round_id, both)
    second = ledger.reserve("r2", "digits", "student", 10, both, mechanism="gnmax", quorum=1)
    ledger.abort(second.round_id, reason="the student vanished")
    third = ledger.reserve("r3", "digits", "student", 10, both, mechanism="gnmax", quorum=1)
    ledger.release(third.round_id)
    ledger.commit(third.round_id, {"hospital-a": cost(10)})
    return ledger


@pytest.fixture(scope="module")
def hub(pki_dir: Path, ledger: Ledger) -> Iterator[RunningServer]:
    server = serve(ledger, "127.0.0.1:0", tls.TLSFiles.in_dir(pki_dir, "guardian"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(
    hub: RunningServer, pki_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TestClient, str]]:
    backends = Backends(
        "127.0.0.1:1",
        f"127.0.0.1:{hub.port}",
        tls.TLSFiles.in_dir(pki_dir, "gateway"),
        "localhost",
    )
    store = TokenStore(str(tmp_path_factory.mktemp("tokens") / "tokens.db"))
    token = store.create("admin", "data-office")[0]
    with TestClient(create_app(backends, store)) as client:
        client.headers["Authorization"] = f"Bearer {token}"
        yield client, token
    backends.close()


def test_the_ledger_counts_every_round_a_party_was_asked_in(ledger: Ledger) -> None:
    by_name = {b.name: b for b in ledger.budgets()}
    # ``rounds`` drops the aborted round, and hospital-b's uncharged one; R keeps them.
    assert (by_name["hospital-a"].rounds, by_name["hospital-b"].rounds) == (2, 1)
    assert by_name["hospital-a"].rounds_asked == by_name["hospital-b"].rounds_asked == ASKED
    a = by_name["hospital-a"]
    assert a.full_delta(DELTA) == pytest.approx(full(a.spent), rel=1e-12)
    # Both terms are there: each above what the other alone gives.
    assert a.full_delta(DELTA) > DELTA + ASKED * 2.0**-40 + ASKED * MAX_CUTOFF_FAILURE
    assert conversion_delta(0) == 0.0 and conversion_delta(1) == MAX_CONVERSION_FAILURE == 2**-40
    with pytest.raises(ValidityError, match="whole number"):
        conversion_delta(-1)


def test_the_admin_api_states_the_ledger_delta_and_the_full_delta(
    gateway: tuple[TestClient, str],
) -> None:
    client, _ = gateway
    budgets_page = client.get("/v1/admin/budgets").json()
    spent = {b["party"]: b["epsilon_spent"] for b in budgets_page["budgets"]}
    fulls = {name: pytest.approx(full(eps), rel=1e-12) for name, eps in spent.items()}
    for b in budgets_page["budgets"]:
        assert (b["delta"], b["ledger_delta"]) == (DELTA, DELTA)
        assert b["rounds_asked"] == ASKED and b["full_delta"] == fulls[b["party"]]
    # The dashboard's data: its budgets table reads /v1/admin/parties.
    for p in client.get("/v1/admin/parties").json()["parties"]:
        assert (p["ledger_delta"], p["rounds_asked"]) == (DELTA, ASKED)
        assert p["full_delta"] == fulls[p["name"]]
    history = client.get("/v1/admin/budgets/history").json()
    assert {s["party"]: (s["rounds_asked"], s["full_delta"]) for s in history["series"]} == {
        name: (ASKED, f) for name, f in fulls.items()
    }
    page = client.get("/v1/admin/ledger", params={"party": "hospital-b"}).json()
    assert page["ledger_delta"] == DELTA
    assert page["rounds_asked"] == {"hospital-b": ASKED}
    assert page["full_delta"] == {"hospital-b": fulls["hospital-b"]}
    html = client.get("/dashboard").text
    assert "δ (ledger)" in html and "+ R·2⁻⁴⁰" in html and "rounds asked (R)" in html
    assert "noise cut-off" in html
    assert "p.full_delta" in client.get("/dashboard.js").text


@pytest.fixture
def capcctl_on(gateway: tuple[TestClient, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """capcctl's real commands, their requests served by the gateway app in-process."""
    client, _ = gateway

    def through_app(url: str, token: str, ca: Any = None, **_: Any) -> Client:
        transport: httpx.BaseTransport = client._transport
        return Client(url, token, transport=transport)

    monkeypatch.setattr(capcctl, "Client", through_app)
    yield


def test_capcctl_budget_shows_the_guarantee_as_text_and_json(
    gateway: tuple[TestClient, str], capcctl_on: None, capfd: pytest.CaptureFixture[str]
) -> None:
    _, token = gateway
    argv = ["--url", "http://127.0.0.1", "--token", token]
    assert capcctl.main(["budget", *argv]) == 0
    text = capfd.readouterr().out
    assert "(eps, ledger delta with the noise cut-off + R 2^-40)" in text
    assert capcctl.main(["budget", *argv, "--json"]) == 0
    out = capfd.readouterr().out
    parsed = json.loads(out)  # the whole of stdout is one JSON value
    got = {b["party"]: (b["rounds_asked"], b["full_delta"]) for b in parsed["budgets"]}
    assert got == {b["party"]: (ASKED, full(b["epsilon_spent"])) for b in parsed["budgets"]}
    for b in parsed["budgets"]:  # the text states the same, one line per hospital
        want = f"delta 1e-05 with the noise cut-off + {ASKED} x 2^-40 = {b['full_delta']:.12g})"
        assert sum(want in line for line in text.splitlines()) == 1
    assert capcctl.main(["ledger", *argv, "--party", "hospital-a"]) == 0
    shown = capfd.readouterr().out
    assert f"hospital-a: guarantee delta 1e-05 with the noise cut-off + {ASKED} x 2^-40" in shown


def test_a_raised_cap_needs_a_reason_and_is_audited_with_it(tmp_path: Path) -> None:
    own = Ledger(str(tmp_path / "own.db"))
    OwnBudget("hospital-a", own, 4.0)
    with pytest.raises(CapRaiseError, match=r"4 eps and 8 raises it: a raise must say why"):
        OwnBudget("hospital-a", own, 8.0)
    assert own.budget("hospital-a").cap == 4.0  # refused before anything changed
    lowered = OwnBudget("hospital-a", own, 3.0)  # lowering needs no reason
    assert lowered.cap == 3.0 and own.audit_entries(limit=1)[0].detail["raised"] is False
    raised = OwnBudget("hospital-a", own, 8.0, cap_reason="the board approved a second study")
    entry = own.audit_entries(limit=1)[0]
    assert (entry.action, entry.actor, entry.detail["raised"]) == ("set_cap", "hospital-a", True)
    assert entry.detail["reason"] == "the board approved a second study"
    # The reason travels with the declaration, and the guardian audits it.
    register = raised.register([])
    assert register.cap_reason == "the board approved a second study"
    guardian = Ledger(str(tmp_path / "guardian.db"))
    guardian.register_party("hospital-a", 10.0, teachers=1)
    budgets.declare(guardian, "hospital-a", guardian_pb2.Register(epsilon_cap=4.0))
    assert budgets.declare(guardian, "hospital-a", register) == 8.0
    declared = guardian.audit_entries(limit=1)[0]
    assert (declared.action, declared.actor) == ("declare_cap", "hospital-a")
    assert declared.detail["raised"] is True
    assert declared.detail["reason"] == "the board approved a second study"
