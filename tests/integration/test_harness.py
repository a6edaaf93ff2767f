"""services.harness: a process is ready when its service answers, never because it
printed a line; one that exits is reported with its output."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.commands.cli import main
from services.common import pki, protocol, tls
from services.harness import (
    NotReadyError,
    Probe,
    Process,
    StatusFiles,
    child_environment,
    child_threads,
    free_port,
    gateway_ready,
    guardian_ready,
    spawn,
    stop_all,
    student_ready,
    wait_ready,
)
from services.proto.capc.v1 import guardian_pb2, guardian_pb2_grpc
from services.testbed.light import light_consortium

#: Seconds a process that never serves is probed before the test calls it not ready:
#: it never answers, so the outcome does not depend on how long this is.
NEVER = 3.0

#: Prints every line the harness once took for readiness, holds the port open (a TCP
#: listener that closes each connection at once) and never serves.
IMPOSTOR = textwrap.dedent(
    """
    import socket, sys
    port = int(sys.argv[1])
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    print(f"guardian serving on port {port} (ledger x)", flush=True)
    print(f"student serving jobs on port {port} for task t", flush=True)
    print(f"Uvicorn running on https://127.0.0.1:{port}", flush=True)
    print("hospital-0 connected to the guardian (cap 10 eps)", flush=True)
    while True:
        s.accept()[0].close()
    """
)


def python(name: str, script: str, *args: str) -> Process:
    popen = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Process(name, popen)


@pytest.fixture
def pki_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "pki"
    pki.issue_dev_consortium(directory, ["hospital-0"])
    pki.issue_https(directory, "gateway", ("localhost", "127.0.0.1"), dev=True)
    return directory


@pytest.fixture
def procs() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    stop_all(started, grace=5)


def test_a_process_that_prints_the_old_ready_lines_but_never_serves_is_not_ready(
    pki_dir: Path, tmp_path: Path, procs: list[Process]
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    impostor = python("impostor", IMPOSTOR, str(port))
    procs.append(impostor)
    assert impostor.said("connected to the guardian")  # every old ready line is out
    probes: dict[str, Probe] = {
        "guardian": guardian_ready(address, pki_dir),
        "student": student_ready(address, pki_dir),
        "gateway": gateway_ready(f"https://{address}", pki_dir / pki.CA_CERT),
        "hospital": StatusFiles((tmp_path / "hospital-0-connected",)),
    }
    for what, probe in probes.items():
        with pytest.raises(NotReadyError) as err:
            wait_ready(impostor, probe, timeout=NEVER)
        message = str(err.value)
        assert f"impostor was not ready within {NEVER:g} s" in message, what
        assert "guardian serving" in message, what  # its output, for whoever reads it
    assert impostor.popen.poll() is None  # still running: only never ready


def test_a_process_that_exits_is_named_with_its_output(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    # No certificates in --pki: the guardian refuses to start and says what to run.
    proc = spawn(
        "guardian",
        "guardian",
        "--db",
        str(tmp_path / "l.db"),
        "--pki",
        str(tmp_path),
        "--listen",
        address,
        ready=guardian_ready(address, None),
    )
    with pytest.raises(NotReadyError) as err:
        proc.wait_ready()
    message = str(err.value)
    assert "guardian exited with code 2 before it was ready" in message
    assert "capc pki issue" in message


def test_readiness_is_not_borrowed_from_another_process_on_the_port(
    pki_dir: Path, tmp_path: Path, procs: list[Process]
) -> None:
    address = f"127.0.0.1:{free_port()}"
    guardian = spawn(
        "guardian",
        "guardian",
        "--db",
        str(tmp_path / "l.db"),
        "--listen",
        address,
        "--pki",
        str(pki_dir),
        "--register",
        "hospital-0=3:1",
        ready=guardian_ready(address, pki_dir),
    )
    procs.append(guardian)
    guardian.wait_ready()
    # Ready means it answers now: an admin call needs no waiting.
    hub = guardian_pb2_grpc.GuardianHubStub(
        tls.secure_channel(
            address, tls.TLSFiles.in_dir(pki_dir, "gateway"), "localhost", role="guardian"
        )
    )
    reply = hub.ListParties(guardian_pb2.ListPartiesRequest(header=protocol.header()), timeout=10)
    assert [p.name for p in reply.parties] == ["hospital-0"]
    # A process that has exited is not ready, though the address it was to serve answers.
    gone = python("late", "print('guardian serving on port 1'); raise SystemExit(3)")
    gone.popen.wait(timeout=60)
    with pytest.raises(NotReadyError, match="late exited with code 3"):
        wait_ready(gone, guardian_ready(address, pki_dir))


def test_status_files_count_only_fresh_files_of_connected_parties(tmp_path: Path) -> None:
    a, b = tmp_path / "a-connected", tmp_path / "b-connected"
    both, one = StatusFiles((a, b)), StatusFiles((a, b), at_least=1)
    with pytest.raises(RuntimeError, match="0 of 2 parties connected"):
        one()
    a.write_text(f"{time.time():.0f}\n")
    one()
    with pytest.raises(RuntimeError, match="1 of 2 parties connected, 2 wanted"):
        both()
    b.write_text(f"{time.time() - 3600:.0f}\n")  # written an hour ago: gone since
    with pytest.raises(RuntimeError, match="s old"):
        both()
    b.write_text(f"{time.time():.0f}\n")
    both()
    both.clear()  # before the parties start: an earlier run's files do not count
    assert not a.exists() and not b.exists()


def test_hospitals_are_ready_once_the_guardian_has_them(tmp_path: Path) -> None:
    with light_consortium(tmp_path, parties=2) as c:
        c.start_guardian()
        proc = c.start_parties(c.names)
        c.wait_connected(proc, 2)
        # Their status files said so: the guardian already lists both as connected.
        assert sorted(c.connected()) == c.names
        with pytest.raises(ValueError, match="hosts 2 parties, not 3"):
            c.wait_connected(proc, 3)


def test_several_parties_in_one_process_need_a_status_file_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["answerer", "--model", "m.pt", "--guardian", "127.0.0.1:1", "--epsilon-cap", "1"]
    argv += ["--name", "a", "--name", "b", "--status-file", str(tmp_path / "connected")]
    assert main(argv) == 2
    assert "put {name} in it" in capsys.readouterr().err


def test_children_get_a_share_of_the_cores_unless_the_operator_set_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A quarter of the cores, at least one: several children share one machine.
    assert [child_threads(c) for c in (1, 2, 4, 8, 16)] == [1, 1, 1, 2, 4]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert child_environment()["OMP_NUM_THREADS"] == str(child_threads())
    # The operator's own setting is kept.
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert child_environment()["OMP_NUM_THREADS"] == "3"
