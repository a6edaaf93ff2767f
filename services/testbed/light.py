"""A light consortium: real processes, one small model, any number of hospitals.

The guardian runs as ``capc guardian`` and the answering parties as one or a
few ``capc answerer`` processes (several parties per process, each with its
own certificate and Connect stream), all over mutual TLS; the student is a
:class:`StudentClient` or ``capc student``. Every hospital votes with the
same untrained MLP on 4 features (random weights, seeded): the availability
tests and the scale benchmark measure rounds, budgets and streams, not
accuracy, so no training time is spent and 200 hospitals fit on one machine.
Any process may run inside a network namespace (``prefix``) and dial the
guardian through an emulated link (services.testbed.netlab). Processes are
started, waited for and stopped through services.harness.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from capc.models import Teacher, build, save_teacher
from capc.task_config import TaskConfig, config_hash
from services import tasks
from services.common import pki, protocol, serde, tls
from services.common.ledger import Ledger
from services.harness import (
    Process,
    StatusFiles,
    free_port,
    guardian_ready,
    spawn,
    stop_all,
    student_ready,
    wait_ready,
)
from services.proto.capc.v1 import common_pb2, guardian_pb2, guardian_pb2_grpc, student_pb2_grpc
from services.student.client import StudentClient

TASK_NAME = "light"
TASK: dict[str, Any] = tasks.load(TASK_NAME)


def queries(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)


def tensor_batch(x: np.ndarray) -> common_pb2.QueryBatch:
    return common_pb2.QueryBatch(tensor=serde.queries_to_proto(x))


@dataclass
class LightConsortium:
    directory: Path
    parties: int = 3
    cap: float = 50.0
    guardian_args: Sequence[str] = ()
    task: dict[str, Any] = field(default_factory=lambda: dict(TASK))
    port: int = 0
    #: Where the guardian listens: a lab link's host address keeps traffic on the lab's addresses.
    listen_host: str = "127.0.0.1"
    student_port: int = 0
    procs: list[Process] = field(default_factory=list)
    guardian: Process | None = None

    @property
    def pki_dir(self) -> Path:
        return self.directory / "pki"

    @property
    def db(self) -> str:
        return str(self.directory / "ledger.db")

    @property
    def names(self) -> list[str]:
        return [f"hospital-{i}" for i in range(self.parties)]

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    @property
    def task_config(self) -> TaskConfig:
        return TaskConfig.parse(TASK_NAME, self.task, config_hash(self.task))

    @property
    def model(self) -> Path:
        return self.directory / "teacher.pt"

    def prepare(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        pki.issue_dev_consortium(self.pki_dir, self.names)
        if not self.model.exists():
            # A multi-label task (``num_labels``) gets a multi-label teacher: one logit a label;
            # an encrypted task its HE-friendly architecture.
            multi = "num_labels" in self.task
            classes = int(self.task.get("num_labels" if multi else "num_classes", 3))
            arch = str(self.task.get("encryption", {}).get("architecture", "mlp"))
            model = build(arch, (4,), classes, 8, seed=0).eval()
            teacher = Teacher(
                arch, (4,), classes, model, {"data": "none"}, width=8, multi_label=multi
            )
            save_teacher(self.model, teacher)
        (self.directory / "task.json").write_text(json.dumps(self.task))

    def start_guardian(self, *extra: str, prefix: Sequence[str] = ()) -> Process:
        self.port = self.port or free_port()
        # One teacher each (the one checkpoint every party loads), pinned by the operator.
        register = [a for n in self.names for a in ("--register", f"{n}={self.cap}:1")]
        proc = spawn(
            "guardian",
            "guardian",
            "--db",
            self.db,
            "--listen",
            self.address,
            "--pki",
            str(self.pki_dir),
            "--task",
            f"{TASK_NAME}={self.directory / 'task.json'}",
            *register,
            # The testbed's students (any certificate a test issues) send random tensors,
            # no one's records: a new ledger would refuse them from unbound queriers.
            "--clear-records-from-unbound",
            "allow",
            *self.guardian_args,
            *extra,
            prefix=prefix,
            ready=guardian_ready(self.address, self.pki_dir),
        )
        self.procs.append(proc)
        proc.wait_ready()
        self.guardian = proc
        return proc

    def start_parties(
        self, names: Sequence[str], target: str | None = None, prefix: Sequence[str] = ()
    ) -> Process:
        """One ``capc answerer`` process hosting ``names``, dialling ``target`` (default the
        guardian's address), run under ``prefix`` (e.g. a lab namespace). Returns at once;
        :meth:`wait_connected` waits for its parties."""
        connected = StatusFiles(tuple(self.status_file(n) for n in names))
        connected.clear()  # an earlier process's files must not count as this one's
        proc = spawn(
            "answerers",
            "answerer",
            "--model",
            str(self.model),
            "--guardian",
            target or self.address,
            *[a for n in names for a in ("--name", n)],
            "--epsilon-cap",
            repr(self.cap),
            # Each hospital keeps its own ledger, even several in one process.
            "--ledger",
            str(self.directory / "{name}-ledger.db"),
            # Each party's own status file, kept fresh while it is connected.
            "--status-file",
            str(self.status_file("{name}")),
            "--pki",
            str(self.pki_dir),
            "--server-name",
            "localhost",
            prefix=prefix,
            ready=connected,
        )
        self.procs.append(proc)
        return proc

    def status_file(self, name: str) -> Path:
        """Party ``name``'s status file (``capc answerer --status-file``)."""
        return self.directory / f"{name}-connected"

    def wait_connected(self, proc: Process, count: int, timeout: float = 300.0) -> None:
        """Return once ``count`` of the parties ``proc`` hosts say they are connected to
        the guardian (their status files); NotReadyError if it exits first or ``timeout``
        s pass."""
        if not isinstance(proc.ready, StatusFiles):
            raise ValueError(f"{proc.name} was not started by start_parties")
        if not 1 <= count <= len(proc.ready.paths):
            raise ValueError(f"{proc.name} hosts {len(proc.ready.paths)} parties, not {count}")
        wait_ready(proc, replace(proc.ready, at_least=count), timeout)

    def start_student(self) -> Process:
        """``capc student``, the jobs API, on a free port (``student_port``)."""
        self.student_port = free_port()
        proc = spawn(
            "student",
            "student",
            "--guardian",
            self.address,
            "--task",
            str(self.directory / "task.json"),
            "--task-name",
            TASK_NAME,
            "--db",
            str(self.directory / "student.db"),
            "--listen",
            f"127.0.0.1:{self.student_port}",
            "--pki",
            str(self.pki_dir),
            "--server-name",
            "localhost",
            ready=student_ready(f"127.0.0.1:{self.student_port}", self.pki_dir),
        )
        self.procs.append(proc)
        proc.wait_ready()
        return proc

    def jobs(self) -> Any:
        """The student party's jobs API, as the gateway reaches it."""
        channel = tls.secure_channel(
            f"127.0.0.1:{self.student_port}",
            tls.TLSFiles.in_dir(self.pki_dir, "gateway"),
            "localhost",
            role="student",
        )
        return student_pb2_grpc.StudentPartyStub(channel)

    def stub(self, name: str = "student", role: str = "guardian") -> Any:
        channel = tls.secure_channel(
            self.address, tls.TLSFiles.in_dir(self.pki_dir, name), "localhost", role=role
        )
        return guardian_pb2_grpc.GuardianHubStub(channel)

    def student(self, timeout: float = 60.0, target: str | None = None) -> StudentClient:
        return StudentClient(
            target or self.address,
            tls.TLSFiles.in_dir(self.pki_dir, "student"),
            self.task_config,
            server_name="localhost",
            timeout=timeout,
        )

    def open_round_without_computing(
        self, x: np.ndarray, student: str = "student"
    ) -> guardian_pb2.OpenRoundReply:
        """A student that opens a round and vanishes: no 2PC session ever runs it."""
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        cfg = self.task_config
        return self.stub(student).OpenRound(  # type: ignore[no-any-return]
            guardian_pb2.OpenRoundRequest(
                header=protocol.header(cfg.name, cfg.config_hash),
                round_key=secrets.token_hex(16),
                queries=tensor_batch(x),
                student_public_key=X25519PrivateKey.generate().public_key().public_bytes_raw(),
            ),
            metadata=[("capc-session-id", secrets.token_hex(16))],
            timeout=60,
        )

    def connected(self) -> list[str]:
        """The parties the guardian reports connected (through the admin API)."""
        reply = self.stub("gateway").ListParties(
            guardian_pb2.ListPartiesRequest(header=protocol.header()), timeout=10
        )
        return [p.name for p in reply.parties if p.connected]

    def ledger(self) -> Ledger:
        return Ledger(self.db)

    def stop(self) -> None:
        stop_all(self.procs)
        self.procs.clear()


@contextmanager
def light_consortium(directory: Path, **kwargs: Any) -> Iterator[LightConsortium]:
    c = LightConsortium(directory, **kwargs)
    c.prepare()
    try:
        yield c
    finally:
        c.stop()


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def rpc_code(err: BaseException) -> grpc.StatusCode | None:
    return err.code() if isinstance(err, grpc.RpcError) else None
