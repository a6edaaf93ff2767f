"""An unknown task name is refused with the names of the known ones, wherever it is met:
the ledger, the guardian's round engine (what a student's failed job then carries) and
the shipped task configurations."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.round.errors import UnknownTaskError
from capc.task_config import config_hash
from services import tasks
from services.common.ledger import Ledger
from services.guardian.rounds import RoundEngine
from services.proto.capc.v1 import common_pb2, guardian_pb2

TASK = {
    "num_classes": 3,
    "input_shape": [2],
    "mechanism": {"name": "gnmax", "sigma": 5.0},
    "quorum": 2,
}


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(str(tmp_path / "l.db"))
    ledger.create_task("images", TASK)
    ledger.create_task("demo", TASK)
    for p in ("a", "b"):
        ledger.register_party(p, 100.0)
    return ledger


def test_the_ledger_names_the_known_tasks(ledger: Ledger) -> None:
    with pytest.raises(
        UnknownTaskError, match=r"^no task named 'imgs'; known tasks: demo, images$"
    ):
        ledger.task("imgs")


def test_an_empty_ledger_says_no_task_is_registered(tmp_path: Path) -> None:
    with pytest.raises(UnknownTaskError, match="no task is registered"):
        Ledger(str(tmp_path / "empty.db")).task("images")


def test_a_round_for_an_unknown_task_names_the_known_ones(ledger: Ledger) -> None:
    """The guardian answers INVALID_ARGUMENT with this message; the student's job fails
    with it as its error (services.student.servicer.JobRunner)."""
    request = guardian_pb2.OpenRoundRequest(
        header=common_pb2.Header(protocol_version=2, task="imgs", config_hash=config_hash(TASK)),
        round_key="k",
        queries=common_pb2.QueryBatch(
            tensor=common_pb2.Tensor(shape=[1, 2], dtype="float32", data=b"\0" * 8)
        ),
        student_public_key=X25519PrivateKey.generate().public_key().public_bytes_raw(),
    )
    engine = RoundEngine(ledger, share_timeout=1.0)
    with pytest.raises(UnknownTaskError, match="known tasks: demo, images"):
        engine.open_round("student", request, b"s" * 16)


def test_the_shipped_tasks_name_the_known_ones() -> None:
    assert {"demo", "images", "light"} <= set(tasks.names())
    known = ", ".join(sorted(tasks.names()))
    with pytest.raises(ValueError, match=rf"no task named 'imgs'; known tasks: {known}$"):
        tasks.load("imgs")
    assert tasks.load("demo")["num_classes"] == 10
