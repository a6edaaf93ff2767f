"""`capc guardian` as a separate process: mutual TLS, SIGKILL, restart with recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from capc.privacy import events
from services.common import pki, tls
from services.guardian.hub import PROTOCOL_VERSION
from services.guardian.ledger import Ledger
from services.guardian.ledger.models import RoundState
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
HEADER = common_pb2.Header(protocol_version=PROTOCOL_VERSION)


def start_guardian(pki_dir: Path, db: str, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "guardian",
            "--db",
            db,
            "--listen",
            f"127.0.0.1:{port}",
            "--pki",
            str(pki_dir),
            "--register",
            "hospital-a=3",
            "--register",
            "hospital-b=3",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for_line(proc, "guardian serving")
    return proc


def wait_for_line(proc: subprocess.Popen[str], text: str, timeout: float = 60) -> str:
    """Read the process's output until ``text`` appears; keep draining it afterwards."""
    assert proc.stdout is not None
    stream = proc.stdout
    seen: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        for line in stream:
            seen.append(line)
            if text in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout):
        raise AssertionError(f"{text!r} not seen; output so far: {''.join(seen)}")
    return "".join(seen)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pki_dir(tmp_path: Path) -> Path:
    pki.init_ca(tmp_path)
    pki.issue(tmp_path, "guardian", "guardian")
    pki.issue(tmp_path, "gateway", "gateway")
    return tmp_path


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def test_guardian_survives_sigkill_without_undercounting(
    pki_dir: Path, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    db = str(tmp_path / "ledger.db")
    port = free_port()
    procs.append(start_guardian(pki_dir, db, port))
    channel = tls.secure_channel(
        f"127.0.0.1:{port}", tls.TLSFiles.in_dir(pki_dir, "gateway"), server_name="localhost"
    )
    hub = guardian_pb2_grpc.GuardianHubStub(channel)
    reply = hub.ListParties(guardian_pb2.ListPartiesRequest(header=HEADER), timeout=10)
    assert {p.name for p in reply.parties} == {"hospital-a", "hospital-b"}

    # Rounds in flight when the guardian dies: one reserved, one released.
    ledger = Ledger(db)
    ledger.create_task("t", {"k": 10})
    cost = events.gnmax(40.0).rdp * 100
    both = {"hospital-a": cost, "hospital-b": cost}
    unreleased = ledger.reserve("u", "t", "student", 100, both, mechanism="gnmax", quorum=2)
    released = ledger.reserve("r", "t", "student", 100, both, mechanism="gnmax", quorum=2)
    ledger.release(released.round_id)
    ledger.close()
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait(timeout=10)

    procs.append(start_guardian(pki_dir, db, port))
    reply = hub.ListParties(
        guardian_pb2.ListPartiesRequest(header=HEADER), timeout=20, wait_for_ready=True
    )
    after = Ledger(db)
    assert after.round_state(unreleased.round_id) == RoundState.ABORTED
    assert after.round_state(released.round_id) == RoundState.COMMITTED
    for p in reply.parties:
        assert p.epsilon_spent == pytest.approx(after.budget(p.name).spent)
        assert (after.spent_rdp(p.name) >= np.asarray(cost)).all()
    audit = hub.ListAudit(guardian_pb2.ListAuditRequest(header=HEADER, limit=10), timeout=10)
    assert audit.chain_valid
    assert {"abort", "commit"} <= {e.action for e in audit.entries if e.actor == "recovery"}


def test_guardian_refuses_to_start_without_certificates(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli",
            "guardian",
            "--db",
            str(tmp_path / "l.db"),
            "--pki",
            str(tmp_path),
            "--listen",
            "127.0.0.1:0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    assert out.returncode == 2
    assert "capc pki issue" in out.stderr


def test_insecure_dev_warns_loudly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "guardian",
            "--db",
            str(tmp_path / "l.db"),
            "--listen",
            "127.0.0.1:0",
            "--insecure-dev",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        seen = wait_for_line(proc, "guardian serving")
        assert "insecure-dev" in seen and "Never use this with real patient data" in seen
    finally:
        proc.kill()
        proc.wait(timeout=10)
