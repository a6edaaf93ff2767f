"""Rounds that are opened but never computed give their reservations back, without a restart.

The round engine on a real ledger, with the student's side of the 2PC run in
this process over an in-memory channel: a round nobody computes is aborted
after the round timeout; a computed round, and one whose 2PC broke after the
release, stay charged; a round reaped while its 2PC waits releases nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mpc import validity
from capc.mpc.channel import HEADER_BYTES, Kind, MemoryChannel, ProtocolError, memory_channel_pair
from capc.mpc.session import EvaluatorSession
from capc.mpc.validity import VoteRelation
from capc.mpc.votes import (
    one_hot_votes,
    open_seeds,
    proven_vote_sum,
    share_proven_votes,
    verifier_shares,
)
from capc.round.errors import RoundRefusedError
from capc.round.ledger import RoundState
from capc.task_config import TaskConfig, config_hash
from services.common import serde
from services.common.ledger import Ledger
from services.guardian.links import PartyLink
from services.guardian.rounds import RoundEngine
from services.proto.capc.v1 import common_pb2, guardian_pb2
from tests.hub_messages import next_work

TASK = {
    "num_classes": 3,
    "input_shape": [2],
    "mechanism": {"name": "gnmax", "sigma": 5.0},
    "quorum": 2,
}
CONFIG = TaskConfig.parse("t", TASK, config_hash(TASK))
SID = b"r" * 16
# Each engine's party links, attached once.
LINKS: dict[int, dict[str, PartyLink]] = {}
BATCH = 4
RELATION = VoteRelation(3, 1)  # one teacher's one-hot vote over the task's 3 classes


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(str(tmp_path / "l.db"))
    ledger.create_task("t", TASK)
    for p in ("a", "b"):
        ledger.register_party(p, 100.0)
    yield ledger
    ledger.close()


def open_answered_round(
    engine: RoundEngine, key: X25519PrivateKey, round_key: str
) -> guardian_pb2.OpenRoundReply:
    """Open a round and answer it as parties a and b (every vote for class 0)."""
    links = LINKS.get(id(engine)) or {p: engine.attach(p) for p in ("a", "b")}
    LINKS[id(engine)] = links
    x = np.zeros((BATCH, 2), dtype="<f4")
    request = guardian_pb2.OpenRoundRequest(
        header=common_pb2.Header(protocol_version=2, task="t", config_hash=CONFIG.config_hash),
        round_key=round_key,
        queries=common_pb2.QueryBatch(
            tensor=common_pb2.Tensor(shape=[BATCH, 2], dtype="float32", data=x.tobytes())
        ),
        student_public_key=key.public_key().public_bytes_raw(),
    )
    box: dict[str, guardian_pb2.OpenRoundReply] = {}
    opener = threading.Thread(
        target=lambda: box.update(reply=engine.open_round("student", request, SID))
    )
    opener.start()
    for name, link in links.items():
        work = next_work(link.outbox)
        assert work is not None
        rid = work.work.round_id
        bits, proof, sealed = share_proven_votes(
            RELATION,
            one_hot_votes(np.zeros(BATCH, dtype=np.int64), 3).astype(np.int64),
            None,
            key.public_key().public_bytes_raw(),
            rid,
            name,
        )
        engine.receive_shares(
            name, serde.shares_to_proto(rid, bits, sealed_seed=sealed, proof=proof)
        )
    opener.join(timeout=10)
    return box["reply"]


def student_check(
    engine: RoundEngine, key: X25519PrivateKey, reply: guardian_pb2.OpenRoundReply
) -> np.ndarray:
    """The student's side of the round's vote check, as services.student.client does it:
    its share (BATCH, 3) of the valid votes' histogram."""
    rid, parties = reply.round_id, list(reply.included)
    seeds = open_seeds(key, {s.party: bytes(s.sealed) for s in reply.seeds}, rid)
    bits, proofs = {}, {}
    for p in parties:
        bits[p], proofs[p] = validity.student_shares(seeds[p], RELATION, BATCH)
    challenge = validity.Challenge.from_bytes(bytes(reply.challenge))
    mine = verifier_shares(dict.fromkeys(parties, RELATION), challenge, parties, bits, proofs)
    header = common_pb2.Header(protocol_version=2, task="t", config_hash=CONFIG.config_hash)
    check = engine.check_votes(
        "student", SID, serde.vote_check_to_proto(header, rid, parties, mine)
    )
    return proven_vote_sum(
        dict.fromkeys(check.included, RELATION), bits, dict(check.vote_weights), student=True
    )


def student_round(
    engine: RoundEngine,
    session: EvaluatorSession,
    key: X25519PrivateKey,
    reply: guardian_pb2.OpenRoundReply,
) -> dict[str, np.ndarray]:
    total = student_check(engine, key, reply)
    spec = CONFIG.circuit_spec(len(reply.included))
    return session.run_round(reply.round_id, spec.circuit(), spec.evaluator_inputs(total), BATCH)


class CutBeforeOutputs:
    """The guardian's end of the 2PC stream; the student vanishes once it has the garbled
    tables, before it returns the guardian's output labels."""

    def __init__(self, inner: MemoryChannel) -> None:
        self.inner = inner

    def send(self, frame: bytes) -> None:
        self.inner.send(frame)

    def recv(self, timeout: float | None = None) -> bytes:
        frame = self.inner.recv(timeout)
        if frame[5] == Kind.OUTPUT_LABELS and len(frame) > HEADER_BYTES:
            raise ProtocolError("the 2PC stream closed before the round finished")
        return frame


def serve(engine: RoundEngine, channel: object) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.serve_compute("student", channel, SID, idle_timeout=3.0)  # type: ignore[arg-type]
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_a_round_nobody_computes_is_aborted_after_the_timeout(ledger: Ledger) -> None:
    engine = RoundEngine(ledger, share_timeout=0.5, round_timeout=1.0)
    reply = open_answered_round(engine, X25519PrivateKey.generate(), "k1")
    rid = reply.round_id
    assert ledger.round_state(rid) == RoundState.RESERVED
    held = ledger.budget("a").spent
    assert held > 0
    assert engine.reap() == []  # not yet: the student may still compute it
    time.sleep(1.1)
    assert engine.reap() == [rid]
    assert ledger.round_state(rid) == RoundState.ABORTED
    assert ledger.budget("a").spent == 0.0 and ledger.budget("b").spent == 0.0
    assert engine.reap() == []
    aborts = [e for e in ledger.audit_entries(10) if e.action == "abort"]
    assert aborts and "--round-timeout" in str(aborts[0].detail["reason"])


def test_a_released_round_stays_charged(ledger: Ledger) -> None:
    engine = RoundEngine(ledger, share_timeout=0.5, round_timeout=1.0)
    key = X25519PrivateKey.generate()
    g_chan, e_chan = memory_channel_pair()
    thread, errors = serve(engine, g_chan)
    student = EvaluatorSession(e_chan, SID, timeout=30)
    student.setup()
    reply = open_answered_round(engine, key, "k2")
    student_round(engine, student, key, reply)
    deadline = time.monotonic() + 10
    while ledger.round_state(reply.round_id) != RoundState.COMMITTED:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    charged = ledger.budget("a").spent
    time.sleep(1.1)
    assert engine.reap() == []
    assert ledger.round_state(reply.round_id) == RoundState.COMMITTED
    assert ledger.budget("a").spent == charged > 0
    thread.join(timeout=10)
    assert not errors


def test_a_2pc_that_breaks_after_the_release_charges_the_reservation_at_once(
    ledger: Ledger,
) -> None:
    engine = RoundEngine(ledger, share_timeout=0.5, round_timeout=30.0)
    key = X25519PrivateKey.generate()
    g_chan, e_chan = memory_channel_pair()
    thread, errors = serve(engine, CutBeforeOutputs(g_chan))
    student = EvaluatorSession(e_chan, SID, timeout=30)
    student.setup()
    reply = open_answered_round(engine, key, "k3")
    reserved = ledger.budget("a").spent
    labels = student_round(engine, student, key, reply)  # the student has its labels ...
    assert labels
    thread.join(timeout=10)
    assert errors and "closed before the round finished" in str(errors[0])
    # ... so the round is charged in full, without waiting for a timeout or a restart.
    assert ledger.round_state(reply.round_id) == RoundState.COMMITTED
    assert ledger.budget("a").spent == pytest.approx(reserved, rel=1e-12)


def test_a_round_reaped_while_its_2pc_waits_releases_nothing(ledger: Ledger) -> None:
    engine = RoundEngine(ledger, share_timeout=0.5, round_timeout=1.0)
    key = X25519PrivateKey.generate()
    g_chan, e_chan = memory_channel_pair()
    thread, _ = serve(engine, g_chan)
    student = EvaluatorSession(e_chan, SID, timeout=30)
    student.setup()
    reply = open_answered_round(engine, key, "k4")
    time.sleep(1.1)  # the garbler waits for the student's round request meanwhile
    assert engine.reap() == [reply.round_id]
    # The student's vote check, the step before its 2PC, is refused: the round is gone.
    with pytest.raises(RoundRefusedError, match="not open for this student session"):
        student_check(engine, key, reply)
    thread.join(timeout=10)
    assert ledger.round_state(reply.round_id) == RoundState.ABORTED
    assert ledger.budget("a").spent == 0.0
    assert not [e for e in ledger.audit_entries(20) if e.action == "release"]


def test_rounds_waiting_for_a_session_that_ends_are_aborted_with_it(ledger: Ledger) -> None:
    engine = RoundEngine(ledger, share_timeout=0.5, round_timeout=60.0)
    key = X25519PrivateKey.generate()
    g_chan, e_chan = memory_channel_pair()
    ended = threading.Event()

    def run() -> None:
        with contextlib.suppress(Exception):  # the broken stream ends the session
            engine.serve_compute("student", g_chan, SID, ended=ended.is_set)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    EvaluatorSession(e_chan, SID, timeout=30).setup()
    # The garbler takes the first round and waits for its request; the second queues.
    first = open_answered_round(engine, key, "k5")
    second = open_answered_round(engine, key, "k6")
    e_chan.send(b"not a frame")  # the stream breaks
    ended.set()
    thread.join(timeout=10)
    for rid in (first.round_id, second.round_id):
        assert ledger.round_state(rid) == RoundState.ABORTED
    assert ledger.budget("a").spent == 0.0


def test_the_round_timeout_must_exceed_the_share_timeout(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="must exceed the share timeout"):
        RoundEngine(ledger, share_timeout=60.0, round_timeout=30.0)
