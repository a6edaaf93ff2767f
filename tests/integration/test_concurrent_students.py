"""Several students at once against one guardian: every round's noise is drawn under the
engine's lock from the guardian's one source, no round fails for the source's sake, and
no two rounds share noise.

Before, the garbler drew each round's noise outside the engine's lock, from the
SecureRandom every session shares (and open() uses): concurrent sessions raised
"RuntimeError: Already borrowed" from the cipher and tore down a student's 2PC.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mechanisms.base import Noise
from capc.mpc import validity
from capc.mpc.channel import memory_channel_pair
from capc.mpc.session import EvaluatorSession
from capc.mpc.validity import VoteRelation
from capc.mpc.votes import (
    one_hot_votes,
    open_seeds,
    proven_vote_sum,
    share_proven_votes,
    verifier_shares,
)
from capc.privacy.randomness import SecureRandom
from capc.round import circuit
from capc.round.ledger import RoundState
from capc.round.state import RoundView
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
HEADER = common_pb2.Header(protocol_version=2, task="t", config_hash=CONFIG.config_hash)
PARTIES = ("a", "b")
STUDENTS, ROUNDS, BATCH = 3, 3, 64
RELATION = VoteRelation(3, 1)


class Watched(SecureRandom):
    """The guardian's source, noting every draw taken while the engine's lock was free."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: RoundEngine | None = None
        self.unlocked = 0

    def _note(self) -> None:
        if self.engine is not None and not self.engine._lock.locked():
            self.unlocked += 1

    def random_bytes(self, n: int) -> bytes:
        self._note()
        return super().random_bytes(n)

    def _take(self, n: int) -> bytes:  # the exact samplers' path
        self._note()
        return super()._take(n)


def answer(engine: RoundEngine, links: dict[str, PartyLink], key: X25519PrivateKey) -> None:
    """Every party answers the round it was just sent (every vote for class 0)."""
    for name, link in links.items():
        msg = next_work(link.outbox, timeout=10)  # past earlier rounds' settlements
        assert msg is not None
        rid = msg.work.round_id
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


def student_round(
    engine: RoundEngine,
    querier: str,
    sid: bytes,
    session: EvaluatorSession,
    key: X25519PrivateKey,
    reply: guardian_pb2.OpenRoundReply,
) -> None:
    """The student's vote check and 2PC for ``reply``'s round (services.student.client's)."""
    rid, parties = reply.round_id, list(reply.included)
    seeds = open_seeds(key, {s.party: bytes(s.sealed) for s in reply.seeds}, rid)
    bits, proofs = {}, {}
    for p in parties:
        bits[p], proofs[p] = validity.student_shares(seeds[p], RELATION, BATCH)
    challenge = validity.Challenge.from_bytes(bytes(reply.challenge))
    mine = verifier_shares(dict.fromkeys(parties, RELATION), challenge, parties, bits, proofs)
    check = engine.check_votes(querier, sid, serde.vote_check_to_proto(HEADER, rid, parties, mine))
    total = proven_vote_sum(
        dict.fromkeys(check.included, RELATION), bits, dict(check.vote_weights), student=True
    )
    spec = CONFIG.circuit_spec(len(check.included))
    session.run_round(rid, spec.circuit(), spec.evaluator_inputs(total), BATCH)


def test_several_students_at_once_get_their_own_noise_and_no_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(str(tmp_path / "l.db"))
    ledger.create_task("t", TASK)
    for p in PARTIES:
        ledger.register_party(p, 1000.0)
    rng = Watched()
    engine = RoundEngine(ledger, share_timeout=10.0, rng=rng)
    rng.engine = engine
    drawn: dict[int, Noise] = {}
    real_draw = circuit.draw_noise

    def recording(rnd: RoundView[TaskConfig], source: SecureRandom) -> Noise:
        noise = real_draw(rnd, source)
        drawn[rnd.round_id] = {k: v.copy() for k, v in noise.items()}
        return noise

    monkeypatch.setattr(circuit, "draw_noise", recording)
    links = {p: engine.attach(p) for p in PARTIES}
    opening = threading.Lock()  # one round collected at a time; the 2PCs overlap
    errors: list[BaseException] = []
    rounds: list[int] = []

    def student(i: int) -> None:
        querier, sid = f"student-{i}", bytes([i + 1]) * 16
        g_chan, e_chan = memory_channel_pair()
        server = threading.Thread(
            target=lambda: engine.serve_compute(querier, g_chan, sid, idle_timeout=30.0),
            daemon=True,
        )
        server.start()
        session = EvaluatorSession(e_chan, sid, timeout=60)
        session.setup()
        for r in range(ROUNDS):
            key = X25519PrivateKey.generate()
            request = guardian_pb2.OpenRoundRequest(
                header=HEADER,
                round_key=f"{querier}-{r}",
                queries=common_pb2.QueryBatch(
                    tensor=common_pb2.Tensor(
                        shape=[BATCH, 2], dtype="float32", data=bytes(8 * BATCH)
                    )
                ),
                student_public_key=key.public_key().public_bytes_raw(),
            )
            with opening:
                box: dict[str, guardian_pb2.OpenRoundReply] = {}

                def open_it(
                    req: guardian_pb2.OpenRoundRequest = request,
                    out: dict[str, guardian_pb2.OpenRoundReply] = box,
                ) -> None:
                    out["reply"] = engine.open_round(querier, req, sid)

                opener = threading.Thread(target=open_it)
                opener.start()
                answer(engine, links, key)
                opener.join(timeout=30)
            reply = box["reply"]
            student_round(engine, querier, sid, session, key, reply)
            rounds.append(reply.round_id)

    def guarded(i: int) -> None:
        try:
            student(i)
        except BaseException as err:  # what the test looks for: any failure
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(STUDENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert errors == []
    assert len(rounds) == STUDENTS * ROUNDS
    for rid in rounds:
        deadline = time.monotonic() + 30  # the guardian commits right after the 2PC
        while ledger.round_state(rid) != RoundState.COMMITTED:
            assert time.monotonic() < deadline, f"round {rid} is {ledger.round_state(rid)}"
            time.sleep(0.05)
    # Every draw from the shared source was taken under the engine's lock.
    assert rng.unlocked == 0
    # Each round drew its own noise, and no two rounds' noise is the same.
    assert sorted(drawn) == sorted(rounds)
    seen = {
        b"".join(np.ascontiguousarray(v).tobytes() for _, v in sorted(n.items()))
        for n in drawn.values()
    }
    assert len(seen) == len(rounds)
    ledger.close()
