"""The fork server that services.harness starts service processes from: each child is a
process of its own (pid, exit code, signals), draws its own noise, seeds and keys,
shares nothing secret with its siblings, and none outlives the process that asked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services import harness
from services.harness import PRELOAD, ROOT, Process, child_environment, fork_server, spawn
from services.testbed.forkserver import ForkedChild, ForkServer, ForkServerError

PROBE = "tests.integration.fork_probe:main"
#: Everything the harness's fork server imports for the services it starts.
EVERY_ROLE = tuple(dict.fromkeys(m for modules in PRELOAD.values() for m in modules))
#: Seconds a process that was told to go is given to be gone: generous, for a loaded machine.
GONE_WITHIN_S = 120.0


def probe(server: ForkServer, *argv: str, **env: str) -> Process:
    child = server.spawn(argv, {**child_environment(), **env}, ROOT, EVERY_ROLE, PROBE)
    return Process("probe", child)


def printed(proc: Process) -> dict[str, Any]:
    out = proc.output(timeout=300)
    assert proc.popen.returncode == 0, out
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.fixture
def server() -> ForkServer:
    """The harness's own fork server: the one services are started from."""
    found = fork_server()
    if found is None:
        pytest.fail(f"no fork server ({harness.SPAWN_ENV}={harness.spawn_mode()})")
    return found


def test_sibling_children_draw_different_noise_seeds_and_keys(server: ForkServer) -> None:
    first, second = printed(probe(server, "draw")), printed(probe(server, "draw"))
    # sympy's two, made when torch's compiler front end (preloaded) imports it.
    assert len(first["import_generators"]) >= 2
    # Each generator on its own: one left as the server seeded it is shared, even when
    # the others make the lists differ.
    ours = first.pop("import_generators")
    theirs = second.pop("import_generators")
    assert len(ours) == len(theirs)
    for i, (value, other) in enumerate(zip(ours, theirs, strict=True)):
        assert value != other, f"two children drew the same from import generator {i}: {value}"
    for source, value in first.items():
        assert value != second[source], f"two children drew the same {source}: {value}"


def test_nothing_secret_open_or_running_is_inherited_from_the_server(
    server: ForkServer,
) -> None:
    state = printed(probe(server, "state"))
    assert state["ppid"] == server.pid  # forked by the server, a process of its own
    assert state["pid"] not in (server.pid, os.getpid())
    assert state["found"] == []
    # Threads and fork do not mix: a lock held by a thread the child lacks stays held.
    assert state["server_threads"] == 1


def test_the_server_runs_one_thread_and_children_get_their_own_thread_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An operator's setting that makes OpenBLAS start a pool of threads when numpy loads.
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    own = ForkServer(ROOT, child_environment())
    try:
        state = printed(probe(own, "state", FORK_PROBE="mine"))
    finally:
        own.close()
    assert state["server_threads"] == 1
    assert state["torch_threads"] == 4 and state["blas_threads"] == [4]
    assert (state["omp"], state["probe"]) == ("4", "mine")  # the child's own environment
    assert Path(state["cwd"]) == ROOT


def test_the_server_refuses_to_fork_once_an_import_started_a_thread() -> None:
    own = ForkServer(ROOT, child_environment())
    try:
        with pytest.raises(ForkServerError, match="runs 2 threads after importing"):
            own.preload(["tests.integration.fork_threads"])
        with pytest.raises(ForkServerError, match="runs 2 threads"):
            own.spawn(["exit", "0"], child_environment(), ROOT, (), PROBE)
    finally:
        own.close()


def test_exit_codes_and_signals_are_the_childs_own(server: ForkServer) -> None:
    assert probe(server, "exit", "3").popen.wait(timeout=300) == 3
    said = probe(server, "exit", "refused: no certificate")
    assert said.popen.wait(timeout=300) == 1
    assert "refused: no certificate" in said.output()
    raised = probe(server, "raise")
    assert raised.popen.wait(timeout=300) == 1
    assert "RuntimeError: the probe raised" in raised.output()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        sleeper = probe(server, "sleep")
        assert sleeper.said("sleeping")
        assert sleeper.popen.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            sleeper.popen.wait(timeout=0.1)
        sleeper.popen.send_signal(sig)
        assert sleeper.popen.wait(timeout=GONE_WITHIN_S) == -sig
        sleeper.popen.send_signal(sig)  # gone: nothing is sent, to it or another process


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


#: Starts the fork server and a child of it that sleeps, prints both pids, then ends as
#: told: "exit" (atexit runs), "kill" (SIGKILL: nothing runs).
ASKER = textwrap.dedent(
    """
    import json, os, signal, sys
    from services.harness import ROOT, child_environment, fork_server
    server = fork_server()
    child = server.spawn(["sleep"], child_environment(), ROOT, (), sys.argv[2])
    assert child.stdout.readline() == "sleeping\\n"
    print(json.dumps([server.pid, child.pid]), flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_no_process_outlives_the_process_that_started_the_server(how: str) -> None:
    asker = subprocess.run(
        [sys.executable, "-c", ASKER, how, PROBE],
        cwd=ROOT,
        env={**os.environ, harness.SPAWN_ENV: "fork"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    server_pid, child_pid = json.loads(asker.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + GONE_WITHIN_S
    while not (gone(server_pid) and gone(child_pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(child_pid), "the service outlived the process that started it"
    assert gone(server_pid), "the fork server outlived the process that started it"


@pytest.fixture
def exec_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(harness.SPAWN_ENV, "exec")
    yield


def test_exec_mode_and_prefixed_commands_start_fresh_interpreters(
    exec_mode: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = spawn("help", "--help")
    assert isinstance(proc.popen, subprocess.Popen)
    assert proc.popen.wait(timeout=300) == 0 and "usage: capc" in proc.output()
    monkeypatch.setenv(harness.SPAWN_ENV, "fork")
    prefixed = spawn("help", "--help", prefix=("env",))  # a command to run: exec'd
    assert isinstance(prefixed.popen, subprocess.Popen)
    assert prefixed.popen.wait(timeout=300) == 0
    forked = spawn("help", "--help")
    assert isinstance(forked.popen, ForkedChild)
    assert forked.popen.wait(timeout=300) == 0 and "usage: capc" in forked.output()
    monkeypatch.setenv(harness.SPAWN_ENV, "vfork")
    with pytest.raises(ValueError, match="CAPC_SPAWN must be fork or exec"):
        spawn("help", "--help")
