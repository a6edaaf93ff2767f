"""The guardian hub over real gRPC with mutual TLS: roles, foreign and expired certificates, admin reads."""

from __future__ import annotations

import datetime as dt
import json
import logging
import queue
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from capc.models import Teacher, build
from capc.task_config import TaskConfig, config_hash
from services.answerer.budget import OwnBudget
from services.answerer.party import AnsweringParty
from services.commands.cli import main
from services.common import pki, tls
from services.common.ledger import Ledger
from services.common.protocol import PROTOCOL_VERSION
from services.gateway.backends import BackendError, Backends
from services.guardian import streams
from services.guardian.hub import RunningServer, serve
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc
from services.student.main import serve_jobs
from services.student.servicer import JobRunner, StudentParty
from services.student.store import JobStore
from services.student.training import ModelTrainer

HEADER = common_pb2.Header(protocol_version=PROTOCOL_VERSION)
STUDENT_TASK = {
    "num_classes": 3,
    "input_shape": [2],
    "mechanism": {"name": "gnmax", "sigma": 5.0},
    "quorum": 1,
}


@pytest.fixture(scope="module")
def pki_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    pki.init_ca(d, dev=True)
    for role, name in (
        ("guardian", "guardian"),
        ("gateway", "gateway"),
        ("answerer", "hospital-a"),
        ("student", "student"),
    ):
        pki.issue(d, role, name, dev=True)
    pki.issue(
        d,
        "gateway",
        "old-gateway",
        dev=True,
        days=1,
        not_before=dt.datetime.now(dt.UTC) - dt.timedelta(days=5),
    )
    return d


@pytest.fixture(scope="module")
def hub(pki_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    ledger = Ledger(str(tmp_path_factory.mktemp("ledger") / "ledger.db"))
    ledger.register_party("hospital-a", 4.0, teachers=1)
    ledger.register_party("hospital-b", 8.0, teachers=1)
    server = serve(ledger, "127.0.0.1:0", tls.TLSFiles.in_dir(pki_dir, "guardian"))
    yield server
    server.stop()


def stub(hub: RunningServer, files: tls.TLSFiles) -> guardian_pb2_grpc.GuardianHubStub:
    return guardian_pb2_grpc.GuardianHubStub(
        tls.secure_channel(f"127.0.0.1:{hub.port}", files, server_name="localhost", role="guardian")
    )


def test_gateway_reads_budgets_over_mutual_tls(hub: RunningServer, pki_dir: Path) -> None:
    reply = stub(hub, tls.TLSFiles.in_dir(pki_dir, "gateway")).ListParties(
        guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10
    )
    assert [p.name for p in reply.parties] == ["hospital-a", "hospital-b"]
    assert reply.parties[0].epsilon_cap == 4.0 and reply.delta == 1e-5


# SetCap as it was on the wire (field 2 party, 3 epsilon_cap, 4 actor), for a client that
# still has it: the RPC is gone, and no certificate can change a cap over the network.
_OLD_SET_CAP = "/capc.v1.GuardianHub/SetCap"


def _old_set_cap(party: str, cap: float, actor: str) -> bytes:
    import struct

    def string(field: int, text: str) -> bytes:
        data = text.encode()
        return bytes([field << 3 | 2, len(data)]) + data

    return string(2, party) + bytes([3 << 3 | 1]) + struct.pack("<d", cap) + string(4, actor)


@pytest.mark.parametrize("who", ["gateway", "student", "hospital-a", "guardian"])
def test_no_certificate_can_change_a_cap_over_the_network(
    hub: RunningServer, pki_dir: Path, who: str
) -> None:
    channel = tls.secure_channel(
        f"127.0.0.1:{hub.port}",
        tls.TLSFiles.in_dir(pki_dir, who),
        server_name="localhost",
        role="guardian",
    )
    call: Any = channel.unary_unary(_OLD_SET_CAP)
    with pytest.raises(grpc.RpcError) as err:
        call(_old_set_cap("hospital-a", 1e6, "gateway:data-office"), timeout=10)
    assert err.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED)
    reply = stub(hub, tls.TLSFiles.in_dir(pki_dir, "gateway")).ListParties(
        guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10
    )
    assert {p.name: p.epsilon_cap for p in reply.parties}["hospital-a"] == 4.0


def test_wrong_role_is_refused_with_a_reason(hub: RunningServer, pki_dir: Path) -> None:
    s = stub(hub, tls.TLSFiles.in_dir(pki_dir, "hospital-a"))
    with pytest.raises(grpc.RpcError) as err:
        s.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
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
    # A student or party of the release before (version 1: overrides, not the job's
    # mechanism; the task inside every round's work) is told what to do.
    with pytest.raises(grpc.RpcError) as err:
        s.ListParties(
            guardian_pb2.ListPartiesRequest(header=common_pb2.Header(protocol_version=1)),
            timeout=10,
        )
    assert "run the same capc release on every party" in str(err.value.details())
    with pytest.raises(grpc.RpcError) as err:
        s.ListLedger(guardian_pb2.ListLedgerRequest(header=HEADER, limit=100_000), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_foreign_certificate_cannot_connect(
    hub: RunningServer, pki_dir: Path, tmp_path: Path
) -> None:
    pki.init_ca(tmp_path, dev=True)
    pki.issue(tmp_path, "gateway", "gateway", dev=True)
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
        tls.secure_channel(
            "127.0.0.1:1", tls.TLSFiles.in_dir(pki_dir, "old-gateway"), role="guardian"
        )


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
        f"127.0.0.1:{hub.port}",
        tls.TLSFiles.in_dir(pki_dir, "hospital-a"),
        server_name="localhost",
        role="guardian",
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


# -- issue 34: revocation, server roles, duplicate identities -------------------------


@pytest.fixture
def own_pki(tmp_path: Path) -> Path:
    """A consortium of its own: these tests revoke certificates."""
    d = tmp_path / "pki"
    pki.init_ca(d, dev=True)
    for role, name in (
        ("guardian", "guardian"),
        ("gateway", "gateway"),
        ("answerer", "hospital-a"),
        ("student", "student"),
    ):
        pki.issue(d, role, name, dev=True)
    return d


@pytest.fixture
def own_hub(own_pki: Path, tmp_path: Path) -> Iterator[tuple[RunningServer, Ledger]]:
    ledger = Ledger(str(tmp_path / "ledger.db"))
    ledger.register_party("hospital-a", 4.0, teachers=7)
    server = serve(ledger, "127.0.0.1:0", tls.TLSFiles.in_dir(own_pki, "guardian"))
    yield server, ledger
    server.stop()


def test_a_revoked_client_is_refused_without_a_restart(
    own_hub: tuple[RunningServer, Ledger], own_pki: Path
) -> None:
    hub, _ = own_hub
    # A plain gRPC channel, as a thief would use: the guardian alone must refuse it.
    files = tls.TLSFiles.in_dir(own_pki, "gateway")
    ca, cert, key = files.read()
    creds = grpc.ssl_channel_credentials(ca, key, cert)
    gateway = guardian_pb2_grpc.GuardianHubStub(
        grpc.secure_channel(
            f"127.0.0.1:{hub.port}", creds, options=[("grpc.ssl_target_name_override", "localhost")]
        )
    )
    gateway.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
    assert main(["pki", "revoke", "--dir", str(own_pki), "gateway"]) == 0
    # The same channel, the same TLS connection: the next call is refused.
    with pytest.raises(grpc.RpcError) as err:
        gateway.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "gateway" in str(err.value.details()) and "revoked" in str(err.value.details())
    # Everyone else still gets in.
    student = stub(hub, tls.TLSFiles.in_dir(own_pki, "student"))
    with pytest.raises(grpc.RpcError) as err:
        student.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def party_stream(
    hub: RunningServer, files: tls.TLSFiles, cap: float | None = 4.0
) -> tuple[queue.Queue[guardian_pb2.PartyMessage | None], Any]:
    """A raw Connect stream, opened with a Register of one teacher declaring ``cap``: what
    the test puts in the queue goes to the guardian."""
    outgoing: queue.Queue[guardian_pb2.PartyMessage | None] = queue.Queue()
    if cap is not None:
        outgoing.put(
            guardian_pb2.PartyMessage(
                header=HEADER,
                register=guardian_pb2.Register(
                    teachers=REGISTER.register.teachers, epsilon_cap=cap
                ),
            )
        )
    responses = stub(hub, files).Connect(iter(outgoing.get, None))
    return outgoing, responses


REGISTER = guardian_pb2.PartyMessage(
    header=HEADER,
    register=guardian_pb2.Register(teachers=[guardian_pb2.TeacherInfo(architecture="mlp")]),
)


def test_a_stream_opens_with_its_register_of_one_to_many_teachers(
    own_hub: tuple[RunningServer, Ledger], own_pki: Path
) -> None:
    hub, _ = own_hub
    files = tls.TLSFiles.in_dir(own_pki, "hospital-a")
    for first, refusal in (
        (guardian_pb2.PartyMessage(header=HEADER, heartbeat=guardian_pb2.Heartbeat()), "Register"),
        (guardian_pb2.PartyMessage(header=HEADER, register=guardian_pb2.Register()), "0 teachers"),
    ):
        outgoing: queue.Queue[guardian_pb2.PartyMessage | None] = queue.Queue()
        outgoing.put(first)
        responses = stub(hub, files).Connect(iter(outgoing.get, None))
        with pytest.raises(grpc.RpcError) as err:
            next(responses)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refusal in str(err.value.details())
        outgoing.put(None)
    ensemble = guardian_pb2.PartyMessage(
        header=HEADER,
        register=guardian_pb2.Register(teachers=[guardian_pb2.TeacherInfo()] * 7, epsilon_cap=4.0),
    )
    outgoing = queue.Queue()
    outgoing.put(ensemble)
    responses = stub(hub, files).Connect(iter(outgoing.get, None))
    assert next(responses).WhichOneof("body") == "registered"
    gateway = stub(hub, tls.TLSFiles.in_dir(own_pki, "gateway"))
    deadline = time.monotonic() + 10
    while True:
        listed = gateway.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
        status = {p.name: p for p in listed.parties}["hospital-a"]
        if status.connected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status.connected and status.teachers == 7
    responses.cancel()
    outgoing.put(None)


def _connect_with(
    hub: RunningServer, files: tls.TLSFiles, teachers: int
) -> tuple[queue.Queue[guardian_pb2.PartyMessage | None], Any]:
    """A raw Connect stream whose Register names ``teachers`` teachers."""
    outgoing: queue.Queue[guardian_pb2.PartyMessage | None] = queue.Queue()
    outgoing.put(
        guardian_pb2.PartyMessage(
            header=HEADER,
            register=guardian_pb2.Register(
                teachers=[guardian_pb2.TeacherInfo(architecture="mlp")] * teachers,
                epsilon_cap=4.0,
            ),
        )
    )
    return outgoing, stub(hub, files).Connect(iter(outgoing.get, None))


def _connected_teachers(hub: RunningServer, own_pki: Path) -> int:
    """hospital-a's teacher count as the guardian reports it, once it is connected."""
    gateway = stub(hub, tls.TLSFiles.in_dir(own_pki, "gateway"))
    deadline = time.monotonic() + 10
    while True:
        listed = gateway.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
        status = {p.name: p for p in listed.parties}["hospital-a"]
        if status.connected:
            return int(status.teachers)
        assert time.monotonic() < deadline, "hospital-a never connected"
        time.sleep(0.1)


def test_a_hospital_claiming_more_teachers_than_pinned_is_refused_and_audited(
    own_hub: tuple[RunningServer, Ledger], own_pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator pins hospital-a at 4 teachers; a deviating hospital-a that registers
    1,024 (whose proofs would then hold it to 1,024 votes, enough to outvote every honest
    party) is refused before it can vote, and the refusal is in the audit log under its
    own identity. Fewer than pinned is its own business: its votes count as declared."""
    hub, ledger = own_hub
    ledger.register_party("hospital-a", 4.0, teachers=4, actor="guardian-cli")
    changed = ledger.audit_entries(limit=1)[0]
    assert (changed.actor, changed.action) == ("guardian-cli", "set_teachers")
    assert (changed.detail["old"], changed.detail["new"]) == (7, 4)
    files = tls.TLSFiles.in_dir(own_pki, "hospital-a")
    entries = len(ledger.audit_entries(limit=1000))
    for claimed in (1024, 5, 6):
        outgoing, responses = _connect_with(hub, files, claimed)
        with pytest.raises(grpc.RpcError) as err:
            next(responses)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        details = str(err.value.details())
        assert f"declared {claimed} teachers, more than the 4" in details
        assert "capc guardian --register hospital-a=EPS:TEACHERS" in details
        outgoing.put(None)
    # The first refusal is audited; the next ones within the interval are counted, so a
    # hospital reconnecting in a loop cannot grow the log.
    fresh = ledger.audit_entries(limit=1000)[: len(ledger.audit_entries(limit=1000)) - entries]
    refused = [e for e in fresh if e.action == "refuse_teachers"]
    assert [(e.actor, e.detail) for e in refused] == [
        (
            "hospital-a",
            {"party": "hospital-a", "declared": 1024, "pinned": 4, "refused_unrecorded_before": 0},
        )
    ]
    monkeypatch.setattr(streams, "DUPLICATE_AUDIT_EVERY_S", 0.0)  # the interval has passed
    outgoing, responses = _connect_with(hub, files, 1000)
    with pytest.raises(grpc.RpcError):
        next(responses)
    outgoing.put(None)
    latest = ledger.audit_entries(limit=1)[0]
    assert latest.action == "refuse_teachers"
    assert (latest.detail["declared"], latest.detail["refused_unrecorded_before"]) == (1000, 2)
    # Nothing of the refused streams reached the ledger (no declared cap) or the engine.
    assert ledger.budget("hospital-a").declared_cap is None
    ledger.verify_audit()
    for honest in (4, 3):
        outgoing, responses = _connect_with(hub, files, honest)
        assert next(responses).WhichOneof("body") == "registered"
        assert _connected_teachers(hub, own_pki) == honest
        responses.cancel()
        outgoing.put(None)
        deadline = time.monotonic() + 10
        while _still_connected(hub, own_pki) and time.monotonic() < deadline:
            time.sleep(0.1)


def _still_connected(hub: RunningServer, own_pki: Path) -> bool:
    gateway = stub(hub, tls.TLSFiles.in_dir(own_pki, "gateway"))
    listed = gateway.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
    return bool({p.name: p for p in listed.parties}["hospital-a"].connected)


def test_a_party_with_no_pinned_teacher_count_is_refused_with_what_to_run(
    own_pki: Path, tmp_path: Path
) -> None:
    """A party registered without a teacher count (a ledger from before the pin, or an
    operator who left it out) cannot vote with any count: the guardian assumes none."""
    ledger = Ledger(str(tmp_path / "ledger.db"))
    ledger.register_party("hospital-a", 4.0)
    server = serve(ledger, "127.0.0.1:0", tls.TLSFiles.in_dir(own_pki, "guardian"))
    try:
        outgoing, responses = _connect_with(server, tls.TLSFiles.in_dir(own_pki, "hospital-a"), 1)
        with pytest.raises(grpc.RpcError) as err:
            next(responses)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        details = str(err.value.details())
        assert "pinned no teacher count" in details
        assert "capc guardian --register hospital-a=EPS:TEACHERS" in details
        outgoing.put(None)
        refused = ledger.audit_entries(limit=1)[0]
        assert refused.action == "refuse_teachers" and refused.detail["pinned"] is None
    finally:
        server.stop()


def test_revocation_cuts_a_stream_that_is_already_open(
    own_hub: tuple[RunningServer, Ledger], own_pki: Path
) -> None:
    hub, _ = own_hub
    outgoing, responses = party_stream(hub, tls.TLSFiles.in_dir(own_pki, "hospital-a"))
    assert next(responses).WhichOneof("body") == "registered"
    assert main(["pki", "revoke", "--dir", str(own_pki), "hospital-a"]) == 0
    outgoing.put(guardian_pb2.PartyMessage(header=HEADER, heartbeat=guardian_pb2.Heartbeat()))
    with pytest.raises(grpc.RpcError) as err:
        next(responses)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "revoked" in str(err.value.details())


def hospital_a(port: int, own_pki: Path, tmp_path: Path) -> AnsweringParty:
    """hospital-a's answering party (one small teacher, its own ledger) dialling ``port``."""
    teacher = Teacher("mlp", (2,), 3, build("mlp", (2,), 3), device="cpu")
    return AnsweringParty(
        "hospital-a",
        teacher,
        f"127.0.0.1:{port}",
        tls.TLSFiles.in_dir(own_pki, "hospital-a"),
        OwnBudget("hospital-a", Ledger(str(tmp_path / "own.db")), 4.0),
        server_name="localhost",
    )


def test_a_revoked_guardian_certificate_is_refused_by_its_clients(
    own_hub: tuple[RunningServer, Ledger], own_pki: Path
) -> None:
    hub, _ = own_hub
    gateway = stub(hub, tls.TLSFiles.in_dir(own_pki, "gateway"))
    gateway.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
    assert main(["pki", "revoke", "--dir", str(own_pki), "guardian"]) == 0
    # A channel already in use notices the new list, and so does a new one.
    for client in (gateway, stub(hub, tls.TLSFiles.in_dir(own_pki, "gateway"))):
        with pytest.raises(grpc.RpcError) as err:
            client.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "guardian" in str(err.value) and "revoked" in str(err.value)


def test_an_answering_party_leaves_a_guardian_revoked_while_its_stream_is_open(
    own_hub: tuple[RunningServer, Ledger],
    own_pki: Path,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """A hospital's one Connect call lasts as long as it runs: the revocation of the
    guardian's certificate must end it, not wait for the next reconnection."""
    hub, _ = own_hub
    party = hospital_a(hub.port, own_pki, tmp_path)
    stop = threading.Event()
    runner = threading.Thread(target=party.run, args=(stop,), daemon=True)
    with caplog.at_level(logging.ERROR, logger="capc.answerer"):
        runner.start()
        try:
            assert party.connected.wait(10)
            assert main(["pki", "revoke", "--dir", str(own_pki), "guardian"]) == 0
            deadline = time.monotonic() + 5
            while party.connected.is_set():
                assert time.monotonic() < deadline, "still voting for a revoked guardian"
                time.sleep(0.05)
        finally:
            stop.set()
            runner.join(10)
    assert "revoked" in caplog.text


class FakeGuardian(guardian_pb2_grpc.GuardianHubServicer):
    """Any consortium member posing as the guardian: it welcomes every party."""

    def __init__(self) -> None:
        self.welcomed = threading.Event()

    def Connect(  # noqa: N802 - the method name the .proto gives
        self, request_iterator: Iterator[guardian_pb2.PartyMessage], context: grpc.ServicerContext
    ) -> Iterator[guardian_pb2.HubMessage]:
        self.welcomed.set()
        yield guardian_pb2.HubMessage(
            header=HEADER, registered=guardian_pb2.Registered(party="x", epsilon_cap=1.0)
        )
        for _ in request_iterator:
            pass


@pytest.fixture
def impostor(own_pki: Path) -> Iterator[tuple[int, FakeGuardian]]:
    """A 'guardian' that serves with the student's certificate."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    fake = FakeGuardian()
    guardian_pb2_grpc.add_GuardianHubServicer_to_server(fake, server)
    port = server.add_secure_port(
        "127.0.0.1:0", tls.server_credentials(tls.TLSFiles.in_dir(own_pki, "student"))
    )
    server.start()
    yield port, fake
    server.stop(0).wait()


def test_an_answering_party_refuses_a_guardian_with_another_role(
    impostor: tuple[int, FakeGuardian],
    own_pki: Path,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    port, fake = impostor
    party = hospital_a(port, own_pki, tmp_path)
    stop = threading.Event()
    runner = threading.Thread(target=party.run, args=(stop,), daemon=True)
    with caplog.at_level(logging.ERROR, logger="capc.answerer"):
        runner.start()
        welcomed = fake.welcomed.wait(2.0)
        stop.set()
        runner.join(10)
    assert not welcomed and not party.connected.is_set()
    assert "role student" in caplog.text and "guardian" in caplog.text


def test_the_gateway_checks_which_server_is_which(
    own_hub: tuple[RunningServer, Ledger], own_pki: Path
) -> None:
    hub, _ = own_hub
    # The guardian's address given as the student's: the gateway must notice.
    backends = Backends(
        f"127.0.0.1:{hub.port}",
        f"127.0.0.1:{hub.port}",
        tls.TLSFiles.in_dir(own_pki, "gateway"),
        server_name="localhost",
    )
    try:
        assert backends.list_parties().parties[0].name == "hospital-a"
        with pytest.raises(BackendError) as err:
            backends.list_jobs(10, 0)
        assert "role guardian" in str(err.value) and "student" in str(err.value)
    finally:
        backends.close()


def test_the_student_party_refuses_a_revoked_gateway(own_pki: Path, tmp_path: Path) -> None:
    task = TaskConfig.parse("t", STUDENT_TASK, config_hash(STUDENT_TASK))
    party = StudentParty(
        JobStore(str(tmp_path / "jobs.db")),
        cast(JobRunner, None),
        task,
        cast(ModelTrainer, None),
    )
    server, port = serve_jobs(party, "127.0.0.1:0", tls.TLSFiles.in_dir(own_pki, "student"))
    address = f"127.0.0.1:{port}"
    backends = Backends(
        address, address, tls.TLSFiles.in_dir(own_pki, "gateway"), server_name="localhost", task="t"
    )
    try:
        assert list(backends.list_jobs(10, 0).jobs) == []
        # The student's address given as the guardian's: refused before any call leaves.
        with pytest.raises(BackendError) as err:
            backends.list_parties()
        assert "role student" in str(err.value) and "guardian" in str(err.value)
        assert main(["pki", "revoke", "--dir", str(own_pki), "gateway"]) == 0
        with pytest.raises(BackendError) as err:
            backends.list_jobs(10, 0)
        assert err.value.code == "UNAUTHENTICATED" and "revoked" in str(err.value)
    finally:
        backends.close()
        server.stop(0).wait()


def test_a_second_stream_under_one_identity_is_refused_and_audited(
    own_hub: tuple[RunningServer, Ledger], own_pki: Path
) -> None:
    hub, ledger = own_hub
    files = tls.TLSFiles.in_dir(own_pki, "hospital-a")
    first_out, first = party_stream(hub, files)
    assert next(first).WhichOneof("body") == "registered"
    _, second = party_stream(hub, files)
    with pytest.raises(grpc.RpcError) as err:
        next(second)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "hospital-a" in str(err.value.details()) and "already connected" in str(
        err.value.details()
    )
    # The first stream is untouched: it still carries the guardian's messages.
    first_out.put(guardian_pb2.PartyMessage(header=HEADER, heartbeat=guardian_pb2.Heartbeat()))
    time.sleep(0.5)
    assert first.is_active()
    audit = stub(hub, tls.TLSFiles.in_dir(own_pki, "gateway")).ListAudit(
        guardian_pb2.ListAuditRequest(header=HEADER, limit=5), timeout=10
    )
    refused = [e for e in audit.entries if e.action == "duplicate_connection_refused"]
    assert len(refused) == 1 and refused[0].actor == "hospital-a"
    detail = json.loads(refused[0].detail_json)
    assert detail["peer"].startswith("ipv4:127.0.0.1:") and detail["connected_from"]
    assert audit.chain_valid and ledger.verify_audit() >= 2
    # Once the first stream is gone, the party reconnects normally.
    first.cancel()
    deadline = time.monotonic() + 10
    while True:
        _, again = party_stream(hub, files)
        try:
            assert next(again).WhichOneof("body") == "registered"
            break
        except grpc.RpcError as retry:
            assert retry.code() == grpc.StatusCode.ALREADY_EXISTS
            assert time.monotonic() < deadline, "the dead stream was never noticed"
            time.sleep(0.2)
    again.cancel()


def test_a_thief_retrying_a_stolen_identity_cannot_fill_the_audit_log(
    own_hub: tuple[RunningServer, Ledger], own_pki: Path
) -> None:
    """Every second stream is refused, but the audit log records the refusals of one
    identity at most once a minute, with how many it left out since: a key in two
    places cannot grow the log without bound."""
    hub, ledger = own_hub
    files = tls.TLSFiles.in_dir(own_pki, "hospital-a")
    first_out, first = party_stream(hub, files)
    assert next(first).WhichOneof("body") == "registered"
    before = ledger.audit_head().seq
    for _ in range(12):
        out, second = party_stream(hub, files)
        with pytest.raises(grpc.RpcError) as err:
            next(second)
        out.put(None)
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert first.is_active()
    entries = ledger.audit_entries(limit=50)
    refused = [e for e in entries if e.seq > before and e.action == "duplicate_connection_refused"]
    assert len(refused) == 1, [e.action for e in entries if e.seq > before]
    first.cancel()
    first_out.put(None)


def test_a_foreign_consortium_gets_a_clear_refusal(
    own_hub: tuple[RunningServer, Ledger], tmp_path: Path
) -> None:
    hub, _ = own_hub
    other = tmp_path / "other"
    pki.init_ca(other, dev=True)
    pki.issue(other, "gateway", "gateway", dev=True)
    with pytest.raises((grpc.RpcError, pki.PKIError)) as err:
        stub(hub, tls.TLSFiles.in_dir(other, "gateway")).ListParties(
            guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10
        )
    assert "CA" in str(err.value) and "Socket closed" not in str(err.value)


def test_a_server_that_distrusts_this_ca_is_explained(own_pki: Path, tmp_path: Path) -> None:
    # The server's certificate is the consortium's, but it trusts another CA for clients.
    other = tmp_path / "other"
    pki.init_ca(other, dev=True)
    files = tls.TLSFiles.in_dir(own_pki, "guardian")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port(
        "127.0.0.1:0",
        grpc.ssl_server_credentials(
            [(files.key.read_bytes(), files.cert.read_bytes())],
            root_certificates=(other / pki.CA_CERT).read_bytes(),
            require_client_auth=True,
        ),
    )
    server.start()
    try:
        channel = tls.secure_channel(
            f"127.0.0.1:{port}",
            tls.TLSFiles.in_dir(own_pki, "gateway"),
            server_name="localhost",
            role="guardian",
        )
        with pytest.raises((grpc.RpcError, pki.PKIError)) as err:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert "did not accept" in str(err.value)
    finally:
        server.stop(0).wait()


def test_a_server_with_an_expired_certificate_is_refused_clearly(
    own_pki: Path, tmp_path: Path
) -> None:
    # Servers refuse to start with an expired certificate; this one expired while running.
    cert, key = pki.issue(
        own_pki,
        "guardian",
        "old-guardian",
        dev=True,
        days=1,
        not_before=dt.datetime.now(dt.UTC) - dt.timedelta(days=5),
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port(
        "127.0.0.1:0",
        grpc.ssl_server_credentials(
            [(key.read_bytes(), cert.read_bytes())],
            root_certificates=(own_pki / pki.CA_CERT).read_bytes(),
            require_client_auth=True,
        ),
    )
    server.start()
    try:
        channel = tls.secure_channel(
            f"127.0.0.1:{port}",
            tls.TLSFiles.in_dir(own_pki, "gateway"),
            server_name="localhost",
            role="guardian",
        )
        with pytest.raises(grpc.RpcError) as err:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "expired" in str(err.value.details())
    finally:
        server.stop(0).wait()


def test_a_service_will_not_use_its_own_revoked_certificate(own_pki: Path, tmp_path: Path) -> None:
    assert main(["pki", "revoke", "--dir", str(own_pki), "guardian"]) == 0
    with pytest.raises(pki.PKIError, match=r"this service \(guardian.*revoked"):
        serve(
            Ledger(str(tmp_path / "l.db")), "127.0.0.1:0", tls.TLSFiles.in_dir(own_pki, "guardian")
        )
    assert main(["pki", "revoke", "--dir", str(own_pki), "gateway"]) == 0
    with pytest.raises(pki.PKIError, match=r"this service \(gateway.*revoked"):
        tls.secure_channel("127.0.0.1:1", tls.TLSFiles.in_dir(own_pki, "gateway"), role="guardian")
