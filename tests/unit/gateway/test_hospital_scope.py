"""Issue 56: a hospital's own gateway (over its CaPC loop's student party) gives its
operator the admin view of that hospital alone. ``capc up --loop`` printed an admin token
for it that read every hospital's budget, ledger and loops, as the consortium's gateway
does. The gateway runs in process over the real guardian hub and ledger; every request
the hub answers is kept, so the test sees which party each read asked for."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

import grpc
import pytest
from fastapi.testclient import TestClient

from services.common.ledger import Ledger
from services.gateway.app import create_app
from services.gateway.backends import BackendError, Backends
from services.gateway.tokens import TokenStore
from services.guardian.hub import GuardianHub
from services.guardian.loop import bind_querier

T = TypeVar("T")
TASK = {"num_classes": 3, "input_shape": [1, 4, 4], "mechanism": {"name": "gnmax", "sigma": 40.0}}


class Context:
    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise RuntimeError(f"{code}: {details}")


class ToTheHub(Backends):
    """The gateway's guardian reads answered by the real hub in process, kept."""

    def __init__(self, hub: GuardianHub, hospital: str) -> None:
        super().__init__("127.0.0.1:1", "127.0.0.1:1", None, task="t", hospital=hospital)
        self.servicer = hub
        self.asked: list[Any] = []

    def call(self, service: str, fn: Callable[..., T], request: object) -> T:
        self.asked.append(request)
        method = getattr(self.servicer, type(request).__name__.removesuffix("Request"), None)
        if method is None:  # the student party's: none runs here
            raise BackendError(service, grpc.StatusCode.UNAVAILABLE, "no student party here")
        return cast(T, method(request, cast(grpc.ServicerContext, Context())))


@pytest.fixture
def hub(tmp_path: Path) -> GuardianHub:
    ledger = Ledger(f"sqlite:///{tmp_path / 'g.db'}")
    ledger.create_task("t", TASK)
    for name in ("hospital-0", "hospital-1", "hospital-2"):
        ledger.register_party(name, 10.0, teachers=1, actor="test")
    bind_querier(ledger, "hospital-0-querier", "hospital-0", actor="test")
    bind_querier(ledger, "hospital-1-querier", "hospital-1", actor="test")
    return GuardianHub(ledger)


def served(tmp_path: Path, hub: GuardianHub, hospital: str) -> tuple[TestClient, ToTheHub, Any]:
    tokens = TokenStore(str(tmp_path / f"t-{hospital or 'all'}.db"))
    secret, _ = tokens.create("admin", "dr-admin")
    backends = ToTheHub(hub, hospital)
    return TestClient(create_app(backends, tokens)), backends, {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def own(tmp_path: Path, hub: GuardianHub) -> Iterator[tuple[TestClient, ToTheHub, Any]]:
    c, backends, auth = served(tmp_path, hub, "hospital-0")
    with c:
        yield c, backends, auth


def test_a_hospitals_own_gateway_shows_that_hospital_alone(
    own: tuple[TestClient, ToTheHub, Any],
) -> None:
    c, backends, auth = own

    def get(path: str) -> Any:
        r = c.get(path, headers=auth)
        assert r.status_code == 200, r.text
        return r.json()

    assert [p["name"] for p in get("/v1/admin/parties")["parties"]] == ["hospital-0"]
    assert [b["party"] for b in get("/v1/admin/budgets")["budgets"]] == ["hospital-0"]
    assert [s["party"] for s in get("/v1/admin/budgets/history")["series"]] == ["hospital-0"]
    assert [x["hospital"] for x in get("/v1/admin/loops")["loops"]] == ["hospital-0"]
    get("/v1/admin/ledger")
    get("/v1/admin/privacy-audits")
    asked = {type(r).__name__: r.party for r in backends.asked if hasattr(r, "party")}
    assert asked["ListLedgerRequest"] == asked["ListPrivacyAuditsRequest"] == "hospital-0"
    # Naming itself is fine; naming another hospital is refused, and says why.
    assert c.get("/v1/admin/ledger?party=hospital-0", headers=auth).status_code == 200
    for path in (
        "/v1/admin/ledger?party=hospital-1",
        "/v1/admin/budgets/history?party=hospital-2",
        "/v1/admin/privacy-audits?party=hospital-1",
    ):
        r = c.get(path, headers=auth)
        assert r.status_code == 403, (path, r.text)
        assert "hospital-0's own" in r.json()["detail"]
    # The audit log stays whole: one hash chain, which a member verifies from its start.
    assert get("/v1/admin/audit")["chain_valid"] is True


def test_the_consortiums_gateway_shows_every_party(tmp_path: Path, hub: GuardianHub) -> None:
    c, _, auth = served(tmp_path, hub, "")
    with c:
        parties = c.get("/v1/admin/parties", headers=auth).json()["parties"]
        assert sorted(p["name"] for p in parties) == ["hospital-0", "hospital-1", "hospital-2"]
        loops = c.get("/v1/admin/loops", headers=auth).json()["loops"]
        assert [x["hospital"] for x in loops] == ["hospital-0", "hospital-1"]
        assert c.get("/v1/admin/ledger?party=hospital-1", headers=auth).status_code == 200


def test_capc_gateway_serve_takes_the_hospital() -> None:
    import argparse

    from services.gateway.args import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    base = ["gateway", "serve", "--student", "s:1", "--guardian", "g:1"]
    assert parser.parse_args([*base, "--hospital", "hospital-0"]).hospital == "hospital-0"
    assert parser.parse_args(base).hospital == ""


def test_a_hospitals_own_gateway_scrapes_that_hospitals_budget_alone(
    tmp_path: Path, own: tuple[TestClient, ToTheHub, Any]
) -> None:
    """/metrics takes an admin (or metrics) token and carries every party's cap and spend,
    the admin API's data: on a hospital's own gateway the other hospitals' stayed in it."""
    c, _, auth = own
    r = c.get("/metrics", headers=auth)
    assert r.status_code == 200, r.text
    named = {
        line.split('party="', 1)[1].split('"', 1)[0]
        for line in r.text.splitlines()
        if line.startswith("capc_party_") and 'party="' in line
    }
    assert named == {"hospital-0"}, named
