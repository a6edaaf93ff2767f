"""Who may record a privacy audit against a hospital: the guardian's operator, or the
hospital's own auditor with its own certificate. The querier side (the gateway and its
admin tokens, the student party) reads audits and cannot write them, so it cannot show
an honest hospital's claim as "refuted" with invented counts.

The guardian runs over real gRPC with mutual TLS; ``capc audit record`` runs in-process
through the real CLI parser; the gateway's REST route runs as FastAPI serves it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient

from services.commands.cli import main
from services.common import pki, tls
from services.common.ledger import Ledger
from services.common.protocol import PROTOCOL_VERSION
from services.gateway.app import create_app
from services.gateway.backends import Backends
from services.gateway.tokens import TokenStore
from services.guardian.hub import RunningServer, serve
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc

HEADER = common_pb2.Header(protocol_version=PROTOCOL_VERSION)
#: Counts that refute any small claim: 95 right of 100 guesses on 100 canaries.
INVENTED: dict[str, Any] = {
    "canaries": 100,
    "guesses": 100,
    "correct": 95,
    "attack": "invented counts",
}


@pytest.fixture(scope="module")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    pki.init_ca(d, dev=True)
    for role, name in (
        ("guardian", "guardian"),
        ("gateway", "gateway"),
        ("student", "student"),
        ("answerer", "hospital-a"),
        ("answerer", "hospital-b"),
    ):
        pki.issue(d, role, name, dev=True)
    return d


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Ledger:
    ledger = Ledger(str(tmp_path_factory.mktemp("ledger") / "ledger.db"))
    ledger.register_party("hospital-a", 4.0, teachers=1)
    ledger.register_party("hospital-b", 8.0, teachers=1)
    return ledger


@pytest.fixture(scope="module")
def hub(pki_dir: Path, ledger: Ledger) -> Iterator[RunningServer]:
    server = serve(ledger, "127.0.0.1:0", tls.TLSFiles.in_dir(pki_dir, "guardian"))
    yield server
    server.stop()


def as_(hub: RunningServer, pki_dir: Path, name: str) -> guardian_pb2_grpc.GuardianHubStub:
    channel = tls.secure_channel(
        f"127.0.0.1:{hub.port}", tls.TLSFiles.in_dir(pki_dir, name), "localhost", role="guardian"
    )
    return guardian_pb2_grpc.GuardianHubStub(channel)


def record(stub: guardian_pb2_grpc.GuardianHubStub, party: str) -> guardian_pb2.PrivacyAudit:
    reply: guardian_pb2.PrivacyAudit = stub.RecordPrivacyAudit(
        guardian_pb2.RecordPrivacyAuditRequest(header=HEADER, party=party, **INVENTED),
        timeout=10,
    )
    return reply


def test_the_querier_side_cannot_record_an_audit_against_anyone(
    hub: RunningServer, pki_dir: Path, ledger: Ledger
) -> None:
    for name in ("gateway", "student"):
        with pytest.raises(grpc.RpcError) as err:
            record(as_(hub, pki_dir, name), "hospital-a")
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "is for answerer, guardian" in str(err.value.details())
    # A hospital records audits against itself only.
    with pytest.raises(grpc.RpcError) as err:
        record(as_(hub, pki_dir, "hospital-b"), "hospital-a")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "hospital-b may record privacy audits against itself only" in str(err.value.details())
    assert "capc audit record" in str(err.value.details())
    assert ledger.privacy_audits("hospital-a") == []
    assert not [e for e in ledger.audit_entries() if e.action == "privacy_audit"]


def test_the_operator_and_the_hospital_itself_record_and_the_gateway_reads(
    hub: RunningServer, pki_dir: Path
) -> None:
    own = record(as_(hub, pki_dir, "hospital-b"), "hospital-b")
    assert (own.party, own.actor, own.refuted) == ("hospital-b", "hospital-b", True)
    operator = record(as_(hub, pki_dir, "guardian"), "hospital-a")
    assert (operator.party, operator.actor) == ("hospital-a", "guardian")
    listed = as_(hub, pki_dir, "gateway").ListPrivacyAudits(
        guardian_pb2.ListPrivacyAuditsRequest(header=HEADER), timeout=10
    )
    assert {(a.party, a.actor) for a in listed.audits} >= {
        ("hospital-b", "hospital-b"),
        ("hospital-a", "guardian"),
    }


def _record_cli(hub: RunningServer, pki_dir: Path, name: str, party: str) -> list[str]:
    return [
        "audit", "record", "--guardian", f"127.0.0.1:{hub.port}", "--pki", str(pki_dir),
        "--server-name", "localhost", "--name", name, "--party", party, "--canaries", "50",
        "--guesses", "10", "--correct", "6", "--attack", "a hospital's own canaries", "--json",
    ]  # fmt: skip


def test_capc_audit_record_signs_with_the_named_certificate(
    hub: RunningServer, pki_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_record_cli(hub, pki_dir, "gateway", "hospital-a")) == 1
    out = capsys.readouterr()
    assert out.out == "" and "PERMISSION_DENIED" in out.err
    assert main(_record_cli(hub, pki_dir, "hospital-a", "hospital-a")) == 0
    out = capsys.readouterr()
    kept = json.loads(out.out)  # --json: the object alone on stdout
    assert (kept["party"], kept["actor"], kept["canaries"]) == ("hospital-a", "hospital-a", 50)
    assert kept["refuted"] is False and kept["claimed_epsilon"] == 0.0


def test_a_gateway_admin_token_is_refused_with_who_may_record(tmp_path: Path) -> None:
    backends = Backends("127.0.0.1:1", "127.0.0.1:1", None, task="t")
    store = TokenStore(str(tmp_path / "tokens.db"))
    admin = {"Authorization": f"Bearer {store.create('admin', 'data-office')[0]}"}
    try:
        with TestClient(create_app(backends, store)) as c:
            r = c.post(
                "/v1/admin/privacy-audits", json={"party": "hospital-a", **INVENTED}, headers=admin
            )
            assert r.status_code == 403, r.text
            detail = r.json()["detail"]
            assert "may read privacy audits here (GET) but no gateway token may record one" in (
                detail
            )
            assert "guardian's operator" in detail and "capc audit record" in detail
            assert c.post("/v1/admin/privacy-audits", json={}).status_code == 401
    finally:
        backends.close()
