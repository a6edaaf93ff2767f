"""The guardian hub over real gRPC with mutual TLS: roles, foreign and expired certificates, admin reads."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common import pki, tls
from services.common.protocol import PROTOCOL_VERSION
from services.guardian.hub import RunningServer, serve
from services.guardian.ledger import Ledger
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc

HEADER = common_pb2.Header(protocol_version=PROTOCOL_VERSION)


@pytest.fixture(scope="module")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    pki.init_ca(d)
    for role, name in (
        ("guardian", "guardian"),
        ("gateway", "gateway"),
        ("answerer", "hospital-a"),
        ("student", "student"),
    ):
        pki.issue(d, role, name)
    pki.issue(
        d,
        "gateway",
        "old-gateway",
        days=1,
        not_before=dt.datetime.now(dt.UTC) - dt.timedelta(days=5),
    )
    return d


@pytest.fixture(scope="module")
def hub(pki_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    ledger = Ledger(str(tmp_path_factory.mktemp("ledger") / "ledger.db"))
    ledger.register_party("hospital-a", 4.0)
    ledger.register_party("hospital-b", 8.0)
    server = serve(ledger, "127.0.0.1:0", tls.TLSFiles.in_dir(pki_dir, "guardian"))
    yield server
    server.stop()


def stub(hub: RunningServer, files: tls.TLSFiles) -> guardian_pb2_grpc.GuardianHubStub:
    return guardian_pb2_grpc.GuardianHubStub(
        tls.secure_channel(f"127.0.0.1:{hub.port}", files, server_name="localhost")
    )


def test_gateway_reads_budgets_over_mutual_tls(hub: RunningServer, pki_dir: Path) -> None:
    reply = stub(hub, tls.TLSFiles.in_dir(pki_dir, "gateway")).ListParties(
        guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10
    )
    assert [p.name for p in reply.parties] == ["hospital-a", "hospital-b"]
    assert reply.parties[0].epsilon_cap == 4.0 and reply.delta == 1e-5


def test_cap_change_is_audited(hub: RunningServer, pki_dir: Path) -> None:
    s = stub(hub, tls.TLSFiles.in_dir(pki_dir, "gateway"))
    reply = s.SetCap(
        guardian_pb2.SetCapRequest(header=HEADER, party="hospital-b", epsilon_cap=6.0), timeout=10
    )
    assert reply.party.epsilon_cap == 6.0
    audit = s.ListAudit(guardian_pb2.ListAuditRequest(header=HEADER, limit=5), timeout=10)
    assert audit.chain_valid
    assert audit.entries[0].action == "set_cap" and audit.entries[0].actor == "gateway"
    with pytest.raises(grpc.RpcError) as err:
        s.SetCap(
            guardian_pb2.SetCapRequest(header=HEADER, party="nobody", epsilon_cap=1.0), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_wrong_role_is_refused_with_a_reason(hub: RunningServer, pki_dir: Path) -> None:
    s = stub(hub, tls.TLSFiles.in_dir(pki_dir, "hospital-a"))
    with pytest.raises(grpc.RpcError) as err:
        s.SetCap(
            guardian_pb2.SetCapRequest(header=HEADER, party="hospital-a", epsilon_cap=100.0),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "hospital-a has role answerer" in str(err.value.details())
    with pytest.raises(grpc.RpcError) as err:
        stub(hub, tls.TLSFiles.in_dir(pki_dir, "student")).ListLedger(
            guardian_pb2.ListLedgerRequest(header=HEADER), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_other_protocol_versions_and_bad_pages_are_invalid(
    hub: RunningServer, pki_dir: Path
) -> None:
    s = stub(hub, tls.TLSFiles.in_dir(pki_dir, "gateway"))
    with pytest.raises(grpc.RpcError) as err:
        s.ListParties(
            guardian_pb2.ListPartiesRequest(header=common_pb2.Header(protocol_version=99)),
            timeout=10,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "protocol version 99" in str(
        err.value.details()
    )
    with pytest.raises(grpc.RpcError) as err:
        s.ListLedger(guardian_pb2.ListLedgerRequest(header=HEADER, limit=100_000), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_foreign_certificate_cannot_connect(
    hub: RunningServer, pki_dir: Path, tmp_path: Path
) -> None:
    pki.init_ca(tmp_path)
    pki.issue(tmp_path, "gateway", "gateway")
    foreign = tls.TLSFiles.in_dir(tmp_path, "gateway")
    # Trust the consortium CA to reach the server, but present another CA's certificate.
    creds = grpc.ssl_channel_credentials(
        (pki_dir / pki.CA_CERT).read_bytes(), foreign.key.read_bytes(), foreign.cert.read_bytes()
    )
    channel = grpc.secure_channel(
        f"127.0.0.1:{hub.port}", creds, options=[("grpc.ssl_target_name_override", "localhost")]
    )
    with pytest.raises(grpc.RpcError) as err:
        guardian_pb2_grpc.GuardianHubStub(channel).ListParties(
            guardian_pb2.ListPartiesRequest(header=HEADER), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_expired_certificate_is_refused_before_dialling(pki_dir: Path) -> None:
    with pytest.raises(pki.PKIError, match="validity window"):
        tls.secure_channel("127.0.0.1:1", tls.TLSFiles.in_dir(pki_dir, "old-gateway"))


def test_expired_certificate_is_refused_by_the_server(hub: RunningServer, pki_dir: Path) -> None:
    files = tls.TLSFiles.in_dir(pki_dir, "old-gateway")
    creds = grpc.ssl_channel_credentials(
        files.ca.read_bytes(), files.key.read_bytes(), files.cert.read_bytes()
    )
    channel = grpc.secure_channel(
        f"127.0.0.1:{hub.port}", creds, options=[("grpc.ssl_target_name_override", "localhost")]
    )
    with pytest.raises(grpc.RpcError) as err:
        guardian_pb2_grpc.GuardianHubStub(channel).ListParties(
            guardian_pb2.ListPartiesRequest(header=HEADER), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_health_service_answers_any_consortium_member(hub: RunningServer, pki_dir: Path) -> None:
    channel = tls.secure_channel(
        f"127.0.0.1:{hub.port}", tls.TLSFiles.in_dir(pki_dir, "hospital-a"), server_name="localhost"
    )
    reply = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service="capc.v1.GuardianHub"), timeout=5
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_open_round_without_a_session_is_invalid(hub: RunningServer, pki_dir: Path) -> None:
    s = stub(hub, tls.TLSFiles.in_dir(pki_dir, "student"))
    with pytest.raises(grpc.RpcError) as err:
        s.OpenRound(guardian_pb2.OpenRoundRequest(header=HEADER), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "capc-session-id" in str(err.value.details())


def test_open_round_for_an_unknown_task_is_invalid(hub: RunningServer, pki_dir: Path) -> None:
    s = stub(hub, tls.TLSFiles.in_dir(pki_dir, "student"))
    header = common_pb2.Header(protocol_version=PROTOCOL_VERSION, task="no-such-task")
    with pytest.raises(grpc.RpcError) as err:
        s.OpenRound(
            guardian_pb2.OpenRoundRequest(header=header),
            metadata=[("capc-session-id", "ab" * 16)],
            timeout=5,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no-such-task" in str(err.value.details())
