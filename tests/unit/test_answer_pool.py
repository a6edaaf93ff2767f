"""The parties of one answerer process answer plain rounds on one shared thread, and
an encrypted round, which waits on the student while it runs, on a thread of its own
party's: it never holds up the others' plain rounds."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from capc.models import Teacher, build
from capc.round.messages import QueryBatch, QueryKind, RoundWork
from capc.task_config import TaskConfig, config_hash
from services.answerer.budget import OwnBudget
from services.answerer.party import AnsweringParty, answer_pool
from services.common.buffers import BoundedBuffer
from services.common.ledger import Ledger
from services.common.serde import PartyWork, TensorQueries
from services.proto.capc.v1 import guardian_pb2

CONFIG: dict[str, object] = {
    "num_classes": 3,
    "input_shape": [4],
    "mechanism": {"name": "gnmax", "sigma": 4.0},
}
#: Seconds a job that must not be held up is given: generous, for a loaded machine.
WITHIN_S = 120.0


def party(name: str, tmp_path: Path, pool: ThreadPoolExecutor | None) -> AnsweringParty:
    model = build("mlp", (4,), 3, 8, seed=0).eval()
    teacher = Teacher("mlp", (4,), 3, model, {"data": "none"}, width=8)
    own = OwnBudget(name, Ledger(str(tmp_path / f"{name}.db")), 10.0)
    return AnsweringParty(name, teacher, "127.0.0.1:9", None, own, pool=pool)


TASK = TaskConfig.parse("t", CONFIG, config_hash(CONFIG))


def work(source: QueryKind, party: str = "hospital-a") -> RoundWork:
    return RoundWork(
        1, party, TASK.mechanism, b"", 1.0, 0, 1, queries=QueryBatch(source, 1), task="t"
    )


def test_parties_share_the_plain_pool_and_each_has_its_own_encrypted_thread(
    tmp_path: Path,
) -> None:
    shared = answer_pool()
    a, b = party("hospital-a", tmp_path, shared), party("hospital-b", tmp_path, shared)
    plain, encrypted = work("tensor"), work("encrypted")
    assert a._pool_for(plain) is b._pool_for(plain) is shared
    own_a, own_b = a._pool_for(encrypted), b._pool_for(encrypted)
    assert shared not in (own_a, own_b) and own_a is not own_b
    assert a._pool_for(encrypted) is own_a  # one a party, made once


def test_an_encrypted_round_in_progress_does_not_hold_up_plain_rounds(tmp_path: Path) -> None:
    shared = answer_pool()
    a, b = party("hospital-a", tmp_path, shared), party("hospital-b", tmp_path, shared)
    student_answers = threading.Event()
    # hospital-a's encrypted round waits for the student's frames ...
    waiting = a._pool_for(work("encrypted")).submit(student_answers.wait, WITHIN_S)
    try:
        # ... while both hospitals' plain rounds are answered.
        for p in (a, b):
            answered = p._pool_for(work("tensor")).submit(str, p.name)
            assert answered.result(WITHIN_S) == p.name
        assert not waiting.done()
    finally:
        student_answers.set()
    assert waiting.result(WITHIN_S) is True


def test_a_party_alone_gets_a_pool_of_its_own(tmp_path: Path) -> None:
    a, b = party("hospital-a", tmp_path, None), party("hospital-b", tmp_path, None)
    assert a._pool_for(work("tensor")) is not b._pool_for(work("tensor"))


def test_a_party_whose_stream_is_full_does_not_hold_up_the_others(tmp_path: Path) -> None:
    """hospital-a's stream to the guardian takes nothing (the guardian waits on a student
    that stopped reading a's relayed frames, or a's network stalls): a's answer waits for
    room, but never on the thread that answers every party's plain rounds."""
    shared = answer_pool()
    a, b = party("hospital-a", tmp_path, shared), party("hospital-b", tmp_path, shared)
    stalled: BoundedBuffer[guardian_pb2.PartyMessage] = BoundedBuffer(1)
    stalled.put(guardian_pb2.PartyMessage())  # full, and nobody reads it
    flowing: BoundedBuffer[guardian_pb2.PartyMessage] = BoundedBuffer(4)
    x = TensorQueries(np.zeros((1, 4), np.float32))
    try:
        # A round for another party is refused: a's refusal waits for room ...
        refused = PartyWork(work("tensor", "someone-else"), TASK, x)
        a._pool_for(work("tensor")).submit(a._answer, refused, stalled)
        # ... and b's round, queued behind it on the shared thread, is still answered.
        b._pool_for(work("tensor")).submit(b._answer, refused, flowing)
        reply = flowing.get(WITHIN_S)
        assert reply is not None and reply.WhichOneof("body") == "failure"
    finally:
        stalled.close()  # a's stream ends: its waiting answer is dropped
    assert shared.submit(str, "free").result(WITHIN_S) == "free"
