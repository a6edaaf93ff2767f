"""Service processes on this machine, for local consortia and tests: start one, know
when it is ready by asking it, stop it.

Readiness is asked of each service the way its deployment's healthcheck asks
(services.common.health, ``capc health``): the guardian and the student party through
the standard gRPC health service over mutual TLS, the gateway through HTTPS
``/healthz``, an answering party, which opens no port, through the status file it keeps
while it is connected to the guardian (``capc answerer --status-file``). Nothing waits
on a log line: what a process prints is kept for people, and for the error raised when
it exits before it is ready. services.local (LocalConsortium) and
services.testbed.light (LightConsortium) start every process through here.

How a process starts (``CAPC_SPAWN``): by default (``fork``) it is forked from a fork
server (services.testbed.forkserver) that has already imported its role's modules, so that it
costs a fork instead of an interpreter start (importing the answering party's modules
takes about 5 s of CPU). It is still a process of its own, with its own pid, output,
exit code and signals; it re-seeds every random generator that the server's imports
seeded, and takes its thread counts from its own environment. The server is started
on the first spawn, ends when this process does, and stops any of its children still
running then. ``CAPC_SPAWN=exec`` starts each process from a fresh interpreter
(``python -m services.commands.cli``), as does a spawn with a ``prefix`` (it runs a command),
and so does any spawn once the fork server could not start or fork (said once, as a
warning on the ``services.harness`` logger).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal, Protocol

from services.common import health, tls
from services.testbed.forkserver import ForkedChild, ForkServer, ForkServerError

ROOT = Path(__file__).resolve().parents[1]
#: Seconds a process may take to become ready: generous, for a loaded machine. The
#: wait ends sooner when the process exits.
READY_TIMEOUT_S = 300.0
#: Seconds between two readiness probes of a process that is starting.
PROBE_EVERY_S = 0.1
#: Seconds a process is given to stop after SIGTERM before it is killed.
STOP_GRACE_S = 15.0
#: Seconds old an answering party's status file may be (``capc health --file``'s
#: default); the party rewrites it every 5 s while connected.
STATUS_MAX_AGE_S = 30.0
#: Characters of a process's last output that an error shows.
TAIL_CHARS = 3000
#: gRPC health service names (services.guardian.hub.SERVICE, services.student.servicer.SERVICE).
GUARDIAN_SERVICE = "capc.v1.GuardianHub"
STUDENT_SERVICE = "capc.v1.StudentParty"

#: How processes start: the environment variable, and its values (see the module's doc).
SPAWN_ENV = "CAPC_SPAWN"
SpawnMode = Literal["fork", "exec"]
#: What the fork server imports before it forks the first process of a role: the
#: ``capc`` subcommand's handler module, and for the roles that train (teachers, the
#: student) torch's compiler front end, which torch imports when an optimizer is first
#: built (about 1.6 s of CPU a process, each time, in a fresh interpreter).
PRELOAD: dict[str, tuple[str, ...]] = {
    "guardian": ("services.guardian.main",),
    "answerer": ("services.answerer.main", "torch._dynamo"),
    "student": ("services.student.main", "torch._dynamo"),
    "gateway": ("services.gateway.main",),
}

#: Returns when the service is ready; raises one of health.UNHEALTHY, saying why, when not.
Probe = Callable[[], None]

_log = logging.getLogger(__name__)


class Child(Protocol):
    """What the harness uses of a child process: a :class:`subprocess.Popen` (text
    output) or a :class:`services.testbed.forkserver.ForkedChild`."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    @property
    def stdout(self) -> IO[str] | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class NotReadyError(RuntimeError):
    """A process exited before it was ready, or was not ready in time; the message names
    it and shows its last output."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    """A child process whose output is drained into ``lines``; ``ready`` probes whether
    it serves (None: nothing to wait for)."""

    name: str
    popen: Child
    ready: Probe | None = None
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        if self.popen.stdout is None:  # spawn always pipes it; nothing to drain otherwise
            return
        for line in self.popen.stdout:
            self.lines.append(line)

    def output(self, timeout: float = 10.0) -> str:
        """Everything the process printed, once it has exited and its output is drained
        (subprocess.TimeoutExpired if it is still running after ``timeout`` s)."""
        self.popen.wait(timeout=timeout)
        self._reader.join(timeout)
        return "".join(self.lines)

    def said(self, text: str, timeout: float = 60.0) -> bool:
        """Whether the process printed ``text`` (waiting up to ``timeout`` s for the line
        to be drained): for tests of what a process tells people. Readiness never waits
        on output; use :meth:`wait_ready`."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.popen.poll() is not None:
                self._reader.join(10)
                return any(text in line for line in self.lines)
            if time.monotonic() > deadline:
                return False
            time.sleep(PROBE_EVERY_S)
        return True

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Return once ``ready`` answers (see :func:`wait_ready`)."""
        if self.ready is None:
            raise ValueError(f"{self.name} was started without a readiness probe")
        wait_ready(self, self.ready, timeout)

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM, then SIGKILL after ``grace`` s (see :func:`stop_all`)."""
        stop_all([self], grace)


def child_threads(cores: int | None = None) -> int:
    """Threads each child's torch operations get: a local consortium runs several
    processes on one machine (a guardian, a student, a gateway, every hospital), and
    torch's default of one thread per core in each oversubscribes the cores, where its
    threads spin against each other (one epoch of a small CNN: 1.6 s of CPU on one
    thread, 13 s on two, on a loaded 2-core machine). A quarter of the cores, at least one."""
    total = (os.cpu_count() or 1) if cores is None else cores
    return max(1, total // 4)


def child_environment() -> dict[str, str]:
    """This process's environment for a child, with ``OMP_NUM_THREADS`` set to
    :func:`child_threads` unless the operator set it."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(child_threads()))
    return env


def spawn_mode() -> SpawnMode:
    """How :func:`spawn` starts processes: ``CAPC_SPAWN``, ``fork`` unless set."""
    mode = os.environ.get(SPAWN_ENV, "fork")
    if mode not in ("fork", "exec"):
        raise ValueError(f"{SPAWN_ENV} must be fork or exec, not {mode!r}")
    return "fork" if mode == "fork" else "exec"


_server: ForkServer | None = None
#: Set once the fork server could not start or fork: every later spawn execs.
_server_failed = False
_server_lock = threading.Lock()


def fork_server() -> ForkServer | None:
    """This process's fork server, started on first use; None where processes are
    exec'd (``CAPC_SPAWN=exec``, not Linux, or the server could not start)."""
    global _server, _server_failed
    if spawn_mode() == "exec" or sys.platform != "linux":
        return None
    with _server_lock:
        if _server_failed:
            return None
        if _server is None or not _server.running():
            try:
                _server = ForkServer(ROOT, child_environment(), timeout=READY_TIMEOUT_S)
            except ForkServerError as err:
                _server_failed = True
                _log.warning("services start from fresh interpreters: %s", err)
                return None
            # Ends it (and any child of it still running) when this process exits;
            # waited for, so that its CPU time is counted as this process's children's.
            atexit.register(_server.close)
        return _server


def _fork(args: Sequence[str]) -> ForkedChild | None:
    """``capc ARGS...`` forked from the fork server; None where it is not used."""
    global _server_failed
    server = fork_server()
    if server is None:
        return None
    preload = list(PRELOAD[args[0]]) if args and args[0] in PRELOAD else []
    try:
        return server.spawn(args, child_environment(), ROOT, preload)
    except ForkServerError as err:
        # Its children so far keep running; it ends with this process.
        with _server_lock:
            _server_failed = True
        _log.warning("services start from fresh interpreters: %s", err)
        return None


def spawn(name: str, *args: str, prefix: Sequence[str] = (), ready: Probe | None = None) -> Process:
    """Run ``capc ARGS...`` as a child process named ``name``, its output drained.

    ``prefix``: a command that runs it, e.g. ``ip netns exec NS`` (services.testbed.netlab);
    ``ready``: how to tell that it serves (:func:`guardian_ready` and the others).
    Forked from the fork server unless ``prefix`` is given or ``CAPC_SPAWN=exec`` (see
    the module's doc).
    """
    child: Child | None = None if prefix else _fork(args)
    if child is None:
        child = subprocess.Popen(
            [*prefix, sys.executable, "-m", "services.commands.cli", *args],
            cwd=ROOT,
            env=child_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return Process(name, child, ready)


def wait_ready(proc: Process, probe: Probe, timeout: float = READY_TIMEOUT_S) -> None:
    """Probe until ``probe`` answers, then return. :class:`NotReadyError` with the
    process's last output as soon as it exits, or once ``timeout`` s have passed."""
    deadline = time.monotonic() + timeout
    why = "not probed yet"
    while proc.popen.poll() is None:
        try:
            probe()
        except health.UNHEALTHY as err:
            why = str(err) or type(err).__name__
        else:
            # Answered: by this process only if it still runs (not another on its port).
            if proc.popen.poll() is None:
                return
            break
        if time.monotonic() > deadline:
            raise NotReadyError(
                f"{proc.name} was not ready within {timeout:g} s (last probe: {why}); "
                f"its last output:\n{''.join(proc.lines)[-TAIL_CHARS:]}"
            )
        # Sleeps between probes, but wakes the moment the process exits.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(PROBE_EVERY_S)
    out = proc.output()
    raise NotReadyError(
        f"{proc.name} exited with code {proc.popen.returncode} before it was ready; "
        f"its last output:\n{out[-TAIL_CHARS:]}"
    )


def stop_all(procs: Iterable[Process], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM every running process in ``procs``, then wait up to ``grace`` s for each
    and SIGKILL those still running: each gets its graceful shutdown first."""
    procs = list(procs)
    for p in procs:
        if p.popen.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait(timeout=5)


def grpc_ready(
    target: str,
    service: str,
    role: str,
    pki_dir: Path | None,
    name: str = "gateway",
    server_name: str | None = "localhost",
) -> Probe:
    """``service`` at ``target`` says SERVING through the gRPC health service, over mutual
    TLS with ``name``'s certificate in ``pki_dir`` to a server whose certificate carries
    ``role`` (``pki_dir=None``: plaintext, a --insecure-dev process)."""
    files = None if pki_dir is None else tls.TLSFiles.in_dir(pki_dir, name)
    return lambda: health.check_grpc(target, files, server_name, role, service)


def guardian_ready(target: str, pki_dir: Path | None, name: str = "gateway") -> Probe:
    """The guardian at ``target`` serves (see :func:`grpc_ready`)."""
    return grpc_ready(target, GUARDIAN_SERVICE, "guardian", pki_dir, name)


def student_ready(target: str, pki_dir: Path | None, name: str = "gateway") -> Probe:
    """A student party's jobs API at ``target`` serves (see :func:`grpc_ready`)."""
    return grpc_ready(target, STUDENT_SERVICE, "student", pki_dir, name)


def gateway_ready(url: str, ca: Path | None) -> Probe:
    """The gateway at ``url`` answers 200 on ``/healthz`` (HTTPS verified against ``ca``):
    it serves, and the student party and guardian behind it do."""
    return lambda: health.check_http(f"{url.rstrip('/')}/healthz", ca, None)


@dataclass(frozen=True)
class StatusFiles:
    """Answering parties' status files (``capc answerer --status-file``): ready when at
    least ``at_least`` of them (all by default) say their party is connected. Call
    :meth:`clear` before the parties start, so that only their own files count."""

    paths: tuple[Path, ...]
    at_least: int | None = None
    max_age: float = STATUS_MAX_AGE_S

    def clear(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)

    def __call__(self) -> None:
        need = len(self.paths) if self.at_least is None else self.at_least
        waiting: list[str] = []
        for path in self.paths:
            try:
                health.check_file(path, self.max_age)
            except health.UNHEALTHY as err:
                waiting.append(f"{path.name}: {err}")
        if len(self.paths) - len(waiting) < need:
            raise RuntimeError(
                f"{len(self.paths) - len(waiting)} of {len(self.paths)} parties connected, "
                f"{need} wanted ({waiting[0]})"
            )
