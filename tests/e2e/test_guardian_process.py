"""`capc guardian` as a separate process: mutual TLS, SIGKILL, restart with recovery."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from capc.privacy import events
from capc.round.ledger import RoundState
from services.common import pki, tls
from services.common.ledger import Ledger, audit
from services.common.protocol import PROTOCOL_VERSION
from services.harness import Process, free_port, guardian_ready, spawn
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
HEADER = common_pb2.Header(protocol_version=PROTOCOL_VERSION)


def start_guardian(pki_dir: Path, db: str, port: int) -> Process:
    proc = spawn(
        "guardian",
        "guardian",
        "--db",
        db,
        "--listen",
        f"127.0.0.1:{port}",
        "--pki",
        str(pki_dir),
        "--register",
        "hospital-a=3:1",
        "--register",
        "hospital-b=3:1",
        ready=guardian_ready(f"127.0.0.1:{port}", pki_dir),
    )
    proc.wait_ready()
    return proc


@pytest.fixture
def pki_dir(tmp_path: Path) -> Path:
    pki.init_ca(tmp_path, dev=True)
    pki.issue(tmp_path, "guardian", "guardian", dev=True)
    pki.issue(tmp_path, "gateway", "gateway", dev=True)
    return tmp_path


@pytest.fixture
def procs() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for p in started:
        if p.popen.poll() is None:
            p.popen.kill()
        p.popen.wait(timeout=10)


def test_guardian_survives_sigkill_without_undercounting(
    pki_dir: Path, tmp_path: Path, procs: list[Process]
) -> None:
    db = str(tmp_path / "ledger.db")
    port = free_port()
    procs.append(start_guardian(pki_dir, db, port))
    channel = tls.secure_channel(
        f"127.0.0.1:{port}",
        tls.TLSFiles.in_dir(pki_dir, "gateway"),
        server_name="localhost",
        role="guardian",
    )
    hub = guardian_pb2_grpc.GuardianHubStub(channel)
    reply = hub.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
    assert {p.name for p in reply.parties} == {"hospital-a", "hospital-b"}

    # Rounds in flight when the guardian dies: one reserved, one released, written as
    # the guardian writes them (with its audit key, so its log stays verifiable).
    ledger = Ledger(db, signer=audit.load_key(pki.audit_key_path(pki_dir, "guardian")))
    ledger.create_task("t", {"k": 10})
    cost = events.repeat(events.GaussianEvent(np.sqrt(2.0), 40.0), 100)
    both = {"hospital-a": cost, "hospital-b": cost}
    unreleased = ledger.reserve("u", "t", "student", 100, both, mechanism="gnmax", quorum=2)
    released = ledger.reserve("r", "t", "student", 100, both, mechanism="gnmax", quorum=2)
    ledger.release(released.round_id)
    ledger.close()
    procs[0].popen.send_signal(signal.SIGKILL)
    procs[0].popen.wait(timeout=10)

    procs.append(start_guardian(pki_dir, db, port))
    reply = hub.ListParties(
        guardian_pb2.ListPartiesRequest(header=HEADER), timeout=20, wait_for_ready=True
    )
    after = Ledger(db)
    assert after.round_state(unreleased.round_id) == RoundState.ABORTED
    assert after.round_state(released.round_id) == RoundState.COMMITTED
    for p in reply.parties:
        assert p.epsilon_spent == pytest.approx(after.budget(p.name).spent)
        assert (after.spent_loss(p.name) >= after.accounting.cost(cost)).all()
    page = hub.ListAudit(guardian_pb2.ListAuditRequest(header=HEADER, limit=10), timeout=10)
    assert page.chain_valid
    assert {"abort", "commit"} <= {e.action for e in page.entries if e.actor == "recovery"}


def test_guardian_refuses_to_start_without_certificates(tmp_path: Path) -> None:
    proc = spawn(
        "guardian",
        "guardian",
        "--db",
        str(tmp_path / "l.db"),
        "--pki",
        str(tmp_path),
        "--listen",
        "127.0.0.1:0",
    )
    assert "capc pki issue" in proc.output(timeout=60)
    assert proc.popen.returncode == 2


def test_insecure_dev_warns_loudly(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    proc = spawn(
        "guardian",
        "guardian",
        "--db",
        str(tmp_path / "l.db"),
        "--listen",
        address,
        "--insecure-dev",
        ready=guardian_ready(address, None),  # plaintext, as it serves
    )
    try:
        proc.wait_ready()
        # Its audit signing key is made beside its ledger, never in the source tree.
        assert (tmp_path / "guardian-audit.key").exists()
        assert not (ROOT / "guardian-audit.key").exists()
    finally:
        proc.stop()
    seen = proc.output()
    assert "insecure-dev" in seen and "Never use this with real patient data" in seen


def test_noise_seed_without_insecure_dev_is_refused(tmp_path: Path) -> None:
    # A seeded guardian repeats its noise after a restart: never by accident.
    proc = spawn(
        "guardian",
        "guardian",
        "--db",
        str(tmp_path / "l.db"),
        "--listen",
        "127.0.0.1:0",
        "--noise-seed",
        "replay-me",
    )
    out = proc.output(timeout=60)
    assert proc.popen.returncode == 2
    assert "--noise-seed needs --insecure-dev" in out and "drop --noise-seed" in out
    assert "guardian serving" not in out and not (tmp_path / "l.db").exists()


def test_seeded_test_guardian_still_serves_mutual_tls(
    pki_dir: Path, tmp_path: Path, procs: list[Process]
) -> None:
    port = free_port()
    proc = spawn(
        "guardian",
        "guardian",
        "--db",
        str(tmp_path / "l.db"),
        "--listen",
        f"127.0.0.1:{port}",
        "--pki",
        str(pki_dir),
        "--register",
        "hospital-a=3:1",
        "--noise-seed",
        "replay-me",
        "--insecure-dev",
        ready=guardian_ready(f"127.0.0.1:{port}", pki_dir),
    )
    procs.append(proc)
    proc.wait_ready()
    secure = guardian_pb2_grpc.GuardianHubStub(
        tls.secure_channel(
            f"127.0.0.1:{port}",
            tls.TLSFiles.in_dir(pki_dir, "gateway"),
            server_name="localhost",
            role="guardian",
        )
    )
    reply = secure.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
    assert [p.name for p in reply.parties] == ["hospital-a"]
    plaintext = guardian_pb2_grpc.GuardianHubStub(
        tls.secure_channel(f"127.0.0.1:{port}", None, role="guardian")
    )
    with pytest.raises(grpc.RpcError):
        plaintext.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=5)
    proc.stop()  # then all it printed is read, start-up warnings included
    seen = proc.output()
    assert "mutual TLS stays on" in seen and "for tests only" in seen
