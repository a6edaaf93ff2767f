"""Deviating students and hospitals against the round engine's relay and vote check.

The real RoundEngine on a real SQLite ledger, with attach()ed party links: in
encrypted mode the guardian forwards sealed frames between a round's student
session and its parties, and each frame must stay inside its round (its
session, its parties, its direction); in plain mode a student's vote check is
refused when malformed, taken once, and an invalid vote it flags is left out
and charged nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

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
from capc.round.errors import RoundInputError, RoundRefusedError, RoundRequestError
from capc.round.ledger import RoundState
from capc.task_config import TaskConfig, config_hash
from services.common import serde
from services.common.ledger import Ledger
from services.guardian.links import PartyLink
from services.guardian.rounds import RoundEngine
from services.proto.capc.v1 import common_pb2, guardian_pb2
from tests.hub_messages import next_work

ENC_TASK: dict[str, object] = {
    "num_classes": 2,
    "input_shape": [30],
    "mechanism": {
        "name": "robust-confident-gnmax",
        "sigma": 0.5,
        "threshold": 2.0,
        "sigma1": 0.5,
    },
    "quorum": 1,
    "encryption": {"architecture": "he-mlp", "width": 16, "params": {}},
}
PLAIN_TASK: dict[str, object] = {
    "num_classes": 3,
    "input_shape": [2],
    "mechanism": {"name": "gnmax", "sigma": 5.0},
    "quorum": 1,
}
ENC = TaskConfig.parse("enc", ENC_TASK, config_hash(ENC_TASK))
PLAIN = TaskConfig.parse("plain", PLAIN_TASK, config_hash(PLAIN_TASK))
SID_A, SID_B = b"a" * 16, b"b" * 16
BATCH = 4
RELATION = VoteRelation(3, 1)  # one teacher's one-hot vote over the plain task's 3 classes
#: Answering parties with a budget (the fixture adds "poor", which cannot afford a round).
PARTIES = ("a", "b", "c", "x", "late")


#: What the engine fixture (tests/integration/conftest.py) puts in its ledger.
ENGINE_TASKS = {"enc": ENC_TASK, "plain": PLAIN_TASK}
ENGINE_PARTIES = {**dict.fromkeys(PARTIES, 100.0), "poor": 1e-9}


def _public_key() -> bytes:
    return X25519PrivateKey.generate().public_key().public_bytes_raw()


def encrypted_request(round_key: str, exclude: Iterable[str] = ()) -> guardian_pb2.OpenRoundRequest:
    """A round of BATCH queries named as CKKS ciphertexts the student relays itself."""
    assert ENC.encryption is not None
    return guardian_pb2.OpenRoundRequest(
        header=common_pb2.Header(protocol_version=2, task="enc", config_hash=ENC.config_hash),
        round_key=round_key,
        queries=common_pb2.QueryBatch(
            encrypted=common_pb2.EncryptedBatch(
                context_id="ab" * 32,
                layout="batched",
                batch=BATCH,
                ciphertexts=1,
                ciphertext_hash=bytes(range(32)),
                settings_json=ENC.encryption.to_json(),
            )
        ),
        student_public_key=_public_key(),
        exclude=list(exclude),
    )


def plain_request(
    round_key: str, key: bytes | None = None, task: dict[str, object] = PLAIN_TASK
) -> guardian_pb2.OpenRoundRequest:
    x = np.zeros((BATCH, 2), dtype="<f4")
    return guardian_pb2.OpenRoundRequest(
        header=common_pb2.Header(protocol_version=2, task="plain", config_hash=config_hash(task)),
        round_key=round_key,
        queries=common_pb2.QueryBatch(
            tensor=common_pb2.Tensor(shape=[BATCH, 2], dtype="float32", data=x.tobytes())
        ),
        student_public_key=key or _public_key(),
    )


def frame(round_id: int, party: str = "", hello: bool = False) -> guardian_pb2.RelayFrame:
    return guardian_pb2.RelayFrame(round_id=round_id, party=party, payload=b"sealed", hello=hello)


def drain(links: dict[str, PartyLink]) -> None:
    for link in links.values():
        while not link.outbox.empty():
            link.outbox.get_nowait()


# -- relayed frames ------------------------------------------------------------------------
def test_frames_naming_another_sessions_round_are_refused(engine: RoundEngine) -> None:
    """Round X (alice, parties a and b) and round Y (bob, party c) run side by side.
    A party of X naming Y, and a student naming the other session's round (under its
    own session, another session id of its own, or the other's id), are refused."""
    links = {p: engine.attach(p) for p in ("a", "b", "c")}
    alice = engine.open_relay("alice", SID_A)
    bob = engine.open_relay("bob", SID_B)
    x = engine.begin_round("alice", encrypted_request("kx", exclude=["c"]), SID_A)
    y = engine.begin_round("bob", encrypted_request("ky", exclude=["a", "b"]), SID_B)
    assert x.included == ("a", "b") and y.included == ("c",)
    drain(links)

    # The honest paths: each frame reaches its own round's peer, naming the real sender.
    box, out = engine.relay_to_student("c", frame(y.round_id, party="a"))
    assert box is bob and out.party == "c" and out.round_id == y.round_id
    outbox, msg = engine.relay_to_party("alice", SID_A, frame(x.round_id, "a"))
    assert outbox is links["a"].outbox and msg.relay.round_id == x.round_id

    # A party of round X names round Y (of bob, which it is not part of).
    for p in ("a", "b"):
        with pytest.raises(RoundInputError, match=f"not an open encrypted round with {p}"):
            engine.relay_to_student(p, frame(y.round_id, party="c"))
    # c names X the other way round.
    with pytest.raises(RoundInputError, match="not an open encrypted round with c"):
        engine.relay_to_student("c", frame(x.round_id))

    # A student names a round of another session.
    for querier, sid, rnd, party in (
        ("alice", SID_A, y, "c"),  # bob's round, from alice's own session
        ("alice", SID_B, y, "c"),  # bob's round, under bob's session id
        ("bob", SID_A, x, "a"),  # alice's round, under alice's session id
        ("alice", SID_B, x, "a"),  # alice's round, from another session of alice
        ("mallory", SID_A, x, "b"),
    ):
        with pytest.raises(RoundInputError, match="another student session"):
            engine.relay_to_party(querier, sid, frame(rnd.round_id, party))
    assert alice.empty() and bob.empty()
    assert all(link.outbox.empty() for link in links.values())
    engine.abandon_round(x, "test over")
    engine.abandon_round(y, "test over")


def test_a_hello_from_the_student_is_refused(engine: RoundEngine) -> None:
    """Hellos open a party's exchange and travel party to student only."""
    links = {p: engine.attach(p) for p in ("a", "b")}
    alice = engine.open_relay("alice", SID_A)
    rnd = engine.begin_round("alice", encrypted_request("kh"), SID_A)
    drain(links)
    box, out = engine.relay_to_student("a", frame(rnd.round_id, hello=True))
    assert box is alice and out.hello and out.party == "a"
    for p in ("a", "b"):
        with pytest.raises(RoundInputError, match="only answering parties send hellos"):
            engine.relay_to_party("alice", SID_A, frame(rnd.round_id, p, hello=True))
    assert all(link.outbox.empty() for link in links.values())
    engine.abandon_round(rnd, "test over")


def test_frames_from_or_to_a_party_outside_the_round_are_refused(engine: RoundEngine) -> None:
    """Connected parties the round does not include: one the student excluded, one the
    reservation left out (its budget), one that connected after the round opened, and
    names that are not connected at all. Neither direction reaches them."""
    links = {p: engine.attach(p) for p in ("a", "b", "x", "poor")}
    alice = engine.open_relay("alice", SID_A)
    rnd = engine.begin_round("alice", encrypted_request("ko", exclude=["x"]), SID_A)
    assert rnd.included == ("a", "b") and "poor" in rnd.excluded
    links["late"] = engine.attach("late")
    drain(links)
    for outsider in ("x", "poor", "late", "mallory"):
        with pytest.raises(RoundInputError, match=f"not an open encrypted round with {outsider}"):
            engine.relay_to_student(outsider, frame(rnd.round_id, party="a"))
        with pytest.raises(RoundInputError, match=f"not an open encrypted round with {outsider}"):
            engine.relay_to_party("alice", SID_A, frame(rnd.round_id, outsider))
    with pytest.raises(RoundInputError, match="with no party"):
        engine.relay_to_party("alice", SID_A, frame(rnd.round_id))
    assert alice.empty() and all(link.outbox.empty() for link in links.values())
    # Once the round is over nobody's frames for it are routed, its parties' included.
    engine.abandon_round(rnd, "test over")
    drain(links)
    with pytest.raises(RoundInputError, match="not an open encrypted round"):
        engine.relay_to_student("a", frame(rnd.round_id))
    with pytest.raises(RoundInputError, match="not an open encrypted round"):
        engine.relay_to_party("alice", SID_A, frame(rnd.round_id, "a"))


def test_frames_from_or_to_a_party_the_round_left_out_are_refused(engine: RoundEngine) -> None:
    links = {p: engine.attach(p) for p in ("a", "b")}
    alice = engine.open_relay("alice", SID_A)
    rnd = engine.begin_round("alice", encrypted_request("kf"), SID_A)
    drain(links)
    assert engine.report_failure("b", rnd.round_id, "gave up")
    try:
        with pytest.raises(RoundInputError):
            engine.relay_to_student("b", frame(rnd.round_id))
        with pytest.raises(RoundInputError):
            engine.relay_to_party("alice", SID_A, frame(rnd.round_id, "b"))
        assert alice.empty() and links["b"].outbox.empty()
    finally:
        engine.abandon_round(rnd, "test over")


def test_frames_for_a_plain_round_are_refused(engine: RoundEngine) -> None:
    """A plain round's queries went to its parties with the work: nothing is relayed,
    even with the student's relay open under the round's session."""
    links = {p: engine.attach(p) for p in ("a", "b")}
    alice = engine.open_relay("alice", SID_A)
    rnd = engine.begin_round("alice", plain_request("kp"), SID_A)
    assert rnd.included == ("a", "b") and rnd.ciphertext_hash is None
    drain(links)
    for p in ("a", "b"):
        with pytest.raises(RoundInputError, match="not an open encrypted round"):
            engine.relay_to_student(p, frame(rnd.round_id))
        with pytest.raises(RoundInputError, match="not an open encrypted round"):
            engine.relay_to_party("alice", SID_A, frame(rnd.round_id, p))
    assert alice.empty() and all(link.outbox.empty() for link in links.values())
    engine.abandon_round(rnd, "test over")


# -- the student's vote check ----------------------------------------------------------------
def proven_round(
    engine: RoundEngine,
    key: X25519PrivateKey,
    round_key: str,
    parties: tuple[str, ...],
    task: dict[str, object] = PLAIN_TASK,
) -> guardian_pb2.OpenRoundReply:
    """Open a plain round as ``alice`` and answer it honestly as ``parties`` (class 0)."""
    links = {p: engine.attach(p) for p in parties}
    box: dict[str, guardian_pb2.OpenRoundReply] = {}
    req = plain_request(round_key, key.public_key().public_bytes_raw(), task)
    opener = threading.Thread(
        target=lambda: box.update(reply=engine.open_round("alice", req, SID_A))
    )
    opener.start()
    votes = one_hot_votes(np.zeros(BATCH, dtype=np.int64), 3).astype(np.int64)
    for p, link in links.items():
        work = next_work(link.outbox)
        assert work is not None
        rid = work.work.round_id
        bits, proof, sealed = share_proven_votes(
            RELATION, votes, None, key.public_key().public_bytes_raw(), rid, p
        )
        engine.receive_shares(p, serde.shares_to_proto(rid, bits, sealed_seed=sealed, proof=proof))
    opener.join(timeout=10)
    reply = box["reply"]
    assert list(reply.included) == list(parties) and len(reply.challenge) == 24
    return reply


def student_side(
    key: X25519PrivateKey, reply: guardian_pb2.OpenRoundReply
) -> tuple[validity.VerifierShare, dict[str, np.ndarray]]:
    """The honest student's verifier shares (P, B), (P,) and its bit shares per party."""
    rid, parties = reply.round_id, list(reply.included)
    seeds = open_seeds(key, {s.party: bytes(s.sealed) for s in reply.seeds}, rid)
    bits, proofs = {}, {}
    for p in parties:
        bits[p], proofs[p] = validity.student_shares(seeds[p], RELATION, BATCH)
    challenge = validity.Challenge.from_bytes(bytes(reply.challenge))
    mine = verifier_shares(dict.fromkeys(parties, RELATION), challenge, parties, bits, proofs)
    return mine, bits


def vote_check(
    round_id: int, parties: list[str], wire: np.ndarray, combined: np.ndarray
) -> guardian_pb2.VoteCheck:
    header = common_pb2.Header(protocol_version=2, task="plain")
    return serde.vote_check_to_proto(
        header, round_id, parties, validity.VerifierShare(wire, combined)
    )


def test_a_malformed_vote_check_is_refused_without_using_up_the_check(
    engine: RoundEngine,
) -> None:
    """Wrong parties (missing, extra, repeated, reordered) or wrong sizes are refused with
    RoundInputError before anything is verified: the round stays reserved, nobody is
    flagged, and the student's one check is still there to take, but only once."""
    ledger = engine.ledger
    key = X25519PrivateKey.generate()
    reply = proven_round(engine, key, "kv", ("a", "b"))
    rid = reply.round_id
    rnd = engine.core._rounds[rid]
    mine, _ = student_side(key, reply)
    w, c = mine.wire, mine.combined
    held = {p: ledger.budget(p).spent for p in ("a", "b")}
    assert all(v > 0 for v in held.values())

    parties_wrong = [
        (["a"], w[:1], c[:1]),  # one proven party left out of the check
        (["b", "a"], w, c),  # the reply's order reversed, the values in the round's order
        (["b", "a"], w[::-1], c[::-1]),  # reversed with the values that go with them
        (["a", "b", "c"], np.vstack([w, w[:1]]), np.concatenate([c, c[:1]])),
        (["a", "a"], w, c),
        ([], w[:0], c[:0]),
    ]
    for parties, wire, combined in parties_wrong:
        with pytest.raises(RoundInputError, match="proven parties in the reply's order"):
            engine.check_votes("alice", SID_A, vote_check(rid, parties, wire, combined))
        assert not rnd.checked
    sizes_wrong = [
        (w[:, :-1], c, "the wire shares"),  # BATCH - 1 values a party
        (np.hstack([w, w[:, :1]]), c, "the wire shares"),  # BATCH + 1
        (w[:1], c, "the wire shares"),  # one party's values for two parties
        (w, c[:1], "the combined shares"),
        (w, np.concatenate([c, c]), "the combined shares"),
    ]
    for wire, combined, what in sizes_wrong:
        with pytest.raises(RoundInputError, match=what):
            engine.check_votes("alice", SID_A, vote_check(rid, ["a", "b"], wire, combined))
        assert not rnd.checked
    # The round's student is alice on session SID_A, nobody else.
    honest = vote_check(rid, ["a", "b"], w, c)
    for querier, sid in (("bob", SID_A), ("alice", SID_B), ("bob", SID_B)):
        with pytest.raises(RoundRefusedError, match="not open for this student session"):
            engine.check_votes(querier, sid, honest)
        assert not rnd.checked

    # Nothing was decided meanwhile: the round holds its reservations, nobody is flagged.
    assert ledger.round_state(rid) == RoundState.RESERVED
    assert {p: ledger.budget(p).spent for p in ("a", "b")} == held
    assert not [e for e in ledger.audit_entries(50) if e.action == "dispute"]
    assert not rnd.invalid

    check = engine.check_votes("alice", SID_A, honest)
    assert list(check.included) == ["a", "b"] and not check.excluded and rnd.checked
    with pytest.raises(RoundInputError, match="checked already"):
        engine.check_votes("alice", SID_A, honest)
    # A repeat cannot flag a party after the fact either.
    w2 = w.copy()
    w2[1, 0] = np.uint64(validity.P)
    with pytest.raises(RoundInputError, match="checked already"):
        engine.check_votes("alice", SID_A, vote_check(rid, ["a", "b"], w2, c))
    assert not rnd.invalid and rnd.used == ("a", "b")
    assert ledger.round_state(rid) == RoundState.RESERVED
    with engine.step() as core:
        core.settle(rid, "test over")


def guardian_side(
    engine: RoundEngine, reply: guardian_pb2.OpenRoundReply
) -> validity.VerifierShare:
    """The guardian's own verifier shares (P, B), (P,) of the round, as check_votes
    computes them (its one-teacher parties vote on every query)."""
    rnd = engine.core._rounds[reply.round_id]
    parties = list(reply.included)
    challenge = validity.Challenge.from_bytes(bytes(reply.challenge))
    ones = {p: np.ones(BATCH, dtype=np.uint64) for p in parties}
    return verifier_shares(rnd.relations, challenge, parties, rnd.shares, rnd.proofs, ones)


def _unreduced(student: np.uint64, guardian: np.uint64) -> np.uint64:
    """An encoding >= p of the student's value that a guardian adding the two shares in
    uint64 with one conditional subtraction of p would take for the honest one: the
    value plus p, or (where the honest sum wraps past p) the value minus p mod 2^64."""
    p = np.uint64(validity.P)
    if int(student) + int(guardian) < validity.P:
        return student + p
    return np.uint64((int(student) - validity.P) % 2**64)


def _out_of_field(
    mine: validity.VerifierShare, theirs: validity.VerifierShare, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """Party b's (row 1) honest verifier shares with one value moved out of [0, p)."""
    wire, combined = mine.wire.copy(), mine.combined.copy()
    if where == "wire, unreduced":
        wire[1, 0] = _unreduced(wire[1, 0], theirs.wire[1, 0])
    elif where == "combined, unreduced":
        combined[1] = _unreduced(combined[1], theirs.combined[1])
    else:
        wire[1, BATCH - 1] = np.uint64(2**64 - 1)
    assert (wire >= validity.P).sum() + (combined >= validity.P).sum() == 1
    return wire, combined


@pytest.mark.parametrize("where", ["wire, unreduced", "combined, unreduced", "wire = 2^64 - 1"])
def test_verifier_values_outside_the_field_fail_the_vote_below_quorum(
    tmp_path: Path, where: str
) -> None:
    """A quorum-2 round of a and b: a value >= p in b's verifier shares fails b's vote,
    even an encoding of the honest value that an unreduced sum would take; below quorum the round is aborted and
    neither party is charged."""
    ledger = Ledger(str(tmp_path / "q.db"))
    ledger.create_task("plain", {**PLAIN_TASK, "quorum": 2})
    for p in ("a", "b"):
        ledger.register_party(p, 100.0)
    engine = RoundEngine(ledger, share_timeout=3.0)
    key = X25519PrivateKey.generate()
    reply = proven_round(engine, key, "kq", ("a", "b"), {**PLAIN_TASK, "quorum": 2})
    rid = reply.round_id
    mine, _ = student_side(key, reply)
    wire, combined = _out_of_field(mine, guardian_side(engine, reply), where)
    with pytest.raises(RoundRefusedError, match=r"1 of 2 votes are valid \(quorum 2\)"):
        engine.check_votes("alice", SID_A, vote_check(rid, ["a", "b"], wire, combined))
    assert ledger.round_state(rid) == RoundState.ABORTED
    assert ledger.budget("a").spent == 0.0 and ledger.budget("b").spent == 0.0
    flagged = [e for e in ledger.audit_entries(50) if e.action == "dispute"]
    assert [(e.detail["querier"], e.detail["party"], e.detail["round"]) for e in flagged] == [
        ("alice", "b", rid)
    ]
    with pytest.raises(RoundRefusedError, match="not open for this student session"):
        engine.check_votes("alice", SID_A, vote_check(rid, ["a", "b"], mine.wire, mine.combined))


def test_an_out_of_field_vote_is_left_out_and_charged_nothing_after_the_2pc(
    engine: RoundEngine,
) -> None:
    """Quorum 1: b's vote with a verifier value >= p (its honest value, unreduced) is left
    out, the check is used up, and after the 2PC a is charged for the round, b nothing."""
    ledger = engine.ledger
    key = X25519PrivateKey.generate()
    g_chan, e_chan = memory_channel_pair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            engine.serve_compute("alice", g_chan, SID_A, idle_timeout=3.0)
        except BaseException as err:
            errors.append(err)

    garbler = threading.Thread(target=serve, daemon=True)
    garbler.start()
    student = EvaluatorSession(e_chan, SID_A, timeout=30)
    student.setup()
    reply = proven_round(engine, key, "k2pc", ("a", "b"))
    rid = reply.round_id
    mine, bits = student_side(key, reply)
    assert ledger.budget("b").spent > 0  # reserved
    wire, combined = _out_of_field(mine, guardian_side(engine, reply), "wire, unreduced")
    check = engine.check_votes("alice", SID_A, vote_check(rid, ["a", "b"], wire, combined))
    assert list(check.included) == ["a"]
    assert [(e.party, "validity proof" in e.reason) for e in check.excluded] == [("b", True)]
    with pytest.raises(RoundInputError, match="checked already"):
        engine.check_votes("alice", SID_A, vote_check(rid, ["a", "b"], mine.wire, mine.combined))
    total = proven_vote_sum(
        dict.fromkeys(check.included, RELATION), bits, dict(check.vote_weights), student=True
    )
    spec = PLAIN.circuit_spec(len(check.included))
    student.run_round(rid, spec.circuit(), spec.evaluator_inputs(total), BATCH)
    garbler.join(timeout=30)
    assert not errors
    assert ledger.round_state(rid) == RoundState.COMMITTED
    assert ledger.budget("a").spent > 0
    assert ledger.budget("b").spent == 0.0
    assert {e.party for e in ledger.entries(round_id=rid) if e.epsilon_alone > 0} == {"a"}


def test_a_retry_without_a_party_is_checked_audited_and_taken_once(engine: RoundEngine) -> None:
    """Issue 41, item 5: a student retries a round without a party whose seed it says did
    not open. A retry that keeps the party in, names another querier's round, or a party
    the round never sent it a seed of, is refused before anything is reserved; a valid
    one settles the old round (aborted: nothing was released) and audits a dispute with
    the student's words as an untrusted note; a round is retried once."""
    ledger = engine.ledger
    key = X25519PrivateKey.generate()
    reply = proven_round(engine, key, "k-old", ("a", "b"))
    old = reply.round_id

    def retry(
        round_key: str, party: str, exclude: list[str], round_id: int = old
    ) -> guardian_pb2.OpenRoundRequest:
        req = plain_request(round_key, key.public_key().public_bytes_raw())
        req.exclude.extend(exclude)
        req.retry.CopyFrom(
            guardian_pb2.RetryWithout(round_id=round_id, party=party, reason="b's seed: bad tag")
        )
        return req

    refused = [
        ("alice", retry("k1", "b", []), "must leave it out"),
        ("bob", retry("k2", "b", ["b"]), "not a recent round of bob"),
        ("alice", retry("k3", "x", ["x"]), "sealed seed"),
        ("alice", retry("k4", "b", ["b"], round_id=old + 100), "not a recent round"),
    ]
    for querier, req, why in refused:
        with pytest.raises(RoundRequestError, match=why):
            engine.begin_round(querier, req, SID_A)
    assert ledger.last_round() == old, "nothing was reserved for a refused retry"
    assert ledger.round_state(old) == RoundState.RESERVED
    assert not [e for e in ledger.audit_entries(50) if e.action == "dispute"]

    rnd = engine.begin_round("alice", retry("k5", "b", ["b"]), SID_A)
    assert rnd.included == ("a",)
    assert ledger.round_state(old) == RoundState.ABORTED
    assert ledger.budget("b").spent == 0.0
    disputes = [e for e in ledger.audit_entries(50) if e.action == "dispute"]
    assert [(e.actor, e.detail, e.note) for e in disputes] == [
        (
            "guardian",
            {"round": old, "querier": "alice", "party": "b", "check": "sealed_seed"},
            "b's seed: bad tag",
        )
    ]
    with pytest.raises(RoundRequestError, match="retried already"):
        engine.begin_round("alice", retry("k6", "b", ["b"]), SID_A)
    engine.abandon_round(rnd, "test over")


def test_a_computed_round_cannot_be_retried_after_it_left_the_engine(
    engine: RoundEngine,
) -> None:
    """A round whose 2PC ran (released, committed: its seeds opened) is no longer in the
    engine's open rounds; a retry naming it must still be refused, or a student could
    take its labels, then blame a party's seed that opened (a dispute against an honest
    hospital at will) and have the same queries answered again."""
    ledger = engine.ledger
    key = X25519PrivateKey.generate()
    g_chan, e_chan = memory_channel_pair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            engine.serve_compute("alice", g_chan, SID_A, idle_timeout=3.0)
        except BaseException as err:
            errors.append(err)

    garbler = threading.Thread(target=serve, daemon=True)
    garbler.start()
    student = EvaluatorSession(e_chan, SID_A, timeout=30)
    student.setup()
    reply = proven_round(engine, key, "k-done", ("a", "b"))
    old = reply.round_id
    mine, bits = student_side(key, reply)
    check = engine.check_votes(
        "alice", SID_A, vote_check(old, ["a", "b"], mine.wire, mine.combined)
    )
    total = proven_vote_sum(
        dict.fromkeys(check.included, RELATION), bits, dict(check.vote_weights), student=True
    )
    spec = PLAIN.circuit_spec(len(check.included))
    student.run_round(old, spec.circuit(), spec.evaluator_inputs(total), BATCH)
    garbler.join(timeout=30)
    assert not errors
    assert ledger.round_state(old) == RoundState.COMMITTED

    req = plain_request("k-again", key.public_key().public_bytes_raw())
    req.exclude.append("b")
    req.retry.CopyFrom(guardian_pb2.RetryWithout(round_id=old, party="b", reason="bad tag"))
    with pytest.raises(RoundRequestError, match="was computed"):
        engine.begin_round("alice", req, SID_A)
    assert ledger.last_round() == old, "nothing was reserved for the refused retry"
    assert not [e for e in ledger.audit_entries(50) if e.action == "dispute"]


def test_a_retry_settles_a_round_the_ending_session_has_not_settled_yet(
    engine: RoundEngine,
) -> None:
    """The student drops its session, then retries: the session's end takes the round out
    of the open rounds a moment before it aborts it in the ledger. A retry arriving in
    that window settles the round itself (nobody can release it any more) rather than
    refusing it as computed, and the ending session's own abort then finds it settled."""
    ledger = engine.ledger
    key = X25519PrivateKey.generate()
    reply = proven_round(engine, key, "k-window", ("a", "b"))
    old = reply.round_id
    with engine._lock:  # what _end_session does first, under the lock
        rnd = engine.core._rounds.pop(old)
    assert ledger.round_state(old) == RoundState.RESERVED
    req = plain_request("k-retry", key.public_key().public_bytes_raw())
    req.exclude.append("b")
    req.retry.CopyFrom(guardian_pb2.RetryWithout(round_id=old, party="b", reason="bad tag"))
    again = engine.begin_round("alice", req, SID_A)
    assert again.included == ("a",)
    assert ledger.round_state(old) == RoundState.ABORTED
    with engine.step() as core:  # the ending session's own settling finds it settled
        core.settle(rnd.round_id, "the student's 2PC session ended")
    assert ledger.round_state(old) == RoundState.ABORTED
    engine.abandon_round(again, "test over")
