"""The guardian's round engine on a real ledger: shares are checked, duplicates and strangers refused."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mechanisms import from_config
from capc.mpc import ring, validity
from capc.mpc.sealing import seal, seed_context
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
from services.common.protocol import RequestError
from services.guardian.round_errors import DuplicateLinkError
from services.guardian.rounds import RoundEngine
from services.proto.capc.v1 import common_pb2, guardian_pb2
from tests.hub_messages import next_work

TASK = {
    "num_classes": 3,
    "input_shape": [2],
    "mechanism": {"name": "gnmax", "sigma": 5.0},
    "quorum": 2,
}
SID = b"s" * 16


#: What the engine fixture (tests/integration/conftest.py) puts in its ledger.
ENGINE_TASKS = {"t": TASK}
ENGINE_PARTIES = dict.fromkeys(("a", "b", "c"), 100.0)


def request(batch: int = 4) -> guardian_pb2.OpenRoundRequest:
    x = np.zeros((batch, 2), dtype="<f4")
    return guardian_pb2.OpenRoundRequest(
        header=common_pb2.Header(protocol_version=2, task="t", config_hash=config_hash(TASK)),
        round_key=f"k{batch}",
        queries=common_pb2.QueryBatch(
            tensor=common_pb2.Tensor(shape=[batch, 2], dtype="float32", data=x.tobytes())
        ),
        student_public_key=X25519PrivateKey.generate().public_key().public_bytes_raw(),
    )


def shares(round_id: int, party: str, batch: int = 4, width: int = 3) -> guardian_pb2.Shares:
    """A one-teacher party's one-hot votes for class 0 with their validity proof."""
    key = X25519PrivateKey.generate().public_key().public_bytes_raw()
    counts = one_hot_votes(np.zeros(batch, dtype=np.int64), width).astype(np.int64)
    bits, proof, sealed = share_proven_votes(
        VoteRelation(width, 1), counts, None, key, round_id, party
    )
    return serde.shares_to_proto(round_id, bits, sealed_seed=sealed, proof=proof)


def test_duplicates_strangers_and_bad_shapes_are_refused(engine: RoundEngine) -> None:
    links = {p: engine.attach(p) for p in ("a", "b", "c")}
    box: dict[str, object] = {}
    t = threading.Thread(
        target=lambda: box.update(reply=engine.open_round("student", request(), SID))
    )
    t.start()
    # The stream is sent the task's definition once, before the first work naming it:
    # the work names the task by name and hash only, and carries the mechanism once.
    first = links["a"].outbox.get(timeout=5)
    assert first is not None and first.WhichOneof("body") == "task"
    assert config_hash(json.loads(first.task.config_json)) == first.header.config_hash
    work = next_work(links["a"].outbox)
    assert work.header.config_hash == first.header.config_hash
    assert links["a"].tasks == {("t", first.header.config_hash)}
    rid = work.work.round_id
    engine.receive_shares("a", shares(rid, "a"))
    with pytest.raises(RoundInputError, match="duplicate"):
        engine.receive_shares("a", shares(rid, "a"))
    with pytest.raises(RoundInputError, match="did not ask"):
        engine.receive_shares("mallory", shares(rid, "mallory"))
    with pytest.raises(RoundInputError, match="did not ask"):
        engine.receive_shares("b", shares(rid + 99, "b"))
    with pytest.raises(RoundInputError, match="shape"):
        engine.receive_shares("b", shares(rid, "b", batch=5))
    bad = shares(rid, "b")
    bad.guardian_share = bad.guardian_share[:-8]
    with pytest.raises(RoundInputError, match="bytes"):
        engine.receive_shares("b", bad)
    # A deviating party's proven shares: no proof, a "bit" outside F_p, no sealed seed.
    unproven = shares(rid, "b")
    unproven.ClearField("proof")
    with pytest.raises(RoundInputError, match="takes vote validity proofs"):
        engine.receive_shares("b", unproven)
    outside = shares(rid, "b")
    outside.guardian_share = (2**64 - 1).to_bytes(8, "little") + outside.guardian_share[8:]
    with pytest.raises(RoundInputError, match="F_p"):
        engine.receive_shares("b", outside)
    seedless = shares(rid, "b")
    seedless.sealed_seed = b""
    with pytest.raises(RoundInputError, match="sealed seed"):
        engine.receive_shares("b", seedless)
    engine.receive_shares("b", shares(rid, "b"))
    engine.report_failure("c", rid, "model crashed")
    t.join(timeout=10)
    reply = box["reply"]
    assert isinstance(reply, guardian_pb2.OpenRoundReply)
    assert list(reply.included) == ["a", "b"] and {s.party for s in reply.seeds} == {"a", "b"}


def test_below_quorum_after_dropouts_aborts_and_charges_nothing(engine: RoundEngine) -> None:
    links = {p: engine.attach(p) for p in ("a", "b")}
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            engine.open_round("student", request(), SID)
        except BaseException as err:
            box["err"] = err

    t = threading.Thread(target=run)
    t.start()
    work = next_work(links["a"].outbox)
    assert work is not None
    engine.receive_shares("a", shares(work.work.round_id, "a"))
    engine.detach(links["b"])  # b drops mid-round
    t.join(timeout=10)
    assert isinstance(box["err"], RoundRefusedError) and "nothing was charged" in str(box["err"])
    assert engine.ledger.round_state(work.work.round_id) == RoundState.ABORTED
    assert engine.ledger.budget("a").spent == 0.0


@pytest.mark.parametrize("mode", ["weighting", "vanishing"])
def test_personalized_rounds_send_each_party_its_weight_or_mask_and_reserve_its_own_cost(
    tmp_path: Path, mode: str
) -> None:
    task = {
        "num_labels": 2,
        "input_shape": [2],
        "mechanism": {"name": "powerset", "sigma": 100.0},
        "quorum": 2,
        "personalization": {"mode": mode, "planned_queries": 100},
    }
    ledger = Ledger(str(tmp_path / "p.db"))
    ledger.create_task("t", task)
    for p, cap in (("a", 2.0), ("b", 2.0), ("c", 8.0)):
        ledger.register_party(p, cap)
    engine = RoundEngine(ledger, share_timeout=3.0)
    links = {p: engine.attach(p) for p in ("a", "b", "c")}
    req = request(batch=64)
    req.header.config_hash = config_hash(task)
    refused: list[Exception] = []

    def open_round() -> None:
        try:
            engine.open_round("student", req, SID)
        except RoundRefusedError as err:
            refused.append(err)

    thread = threading.Thread(target=open_round)
    thread.start()
    works: dict[str, guardian_pb2.HubMessage] = {}
    for p, link in links.items():
        msg = next_work(link.outbox)
        assert msg is not None
        works[p] = msg
    rid = works["a"].work.round_id
    cfg = TaskConfig.parse("t", task, config_hash(task))
    reserved = {e.party: e.epsilon_alone for e in ledger.entries(round_id=rid)}
    for p, msg in works.items():
        work = msg.work
        assert work.mechanism.name == "powerset" and work.mechanism.outputs == 2
        voted = 64
        if mode == "weighting":
            assert not work.participation and work.frac_bits == 8
        else:
            assert work.vote_weight == 1.0
            voted = int(np.unpackbits(np.frombuffer(work.participation, np.uint8)).sum())
        worst = cfg.mechanism.worst_case(voted, work.vote_weight)
        acct = ledger.accounting
        assert reserved[p] == pytest.approx(
            acct.spent(acct.cost(worst), ledger.delta).epsilon, rel=1e-9
        )
    w = {p: m.work.vote_weight for p, m in works.items()}
    if mode == "weighting":
        assert w["a"] == w["b"] < 1.0 < w["c"]
    else:
        masks = {
            p: np.unpackbits(np.frombuffer(m.work.participation, np.uint8))
            for p, m in works.items()
        }
        assert masks["c"].all() and 0 < masks["a"].sum() < 48
    # A powerset task takes votes over the 2**k subsets: k-wide shares are refused.
    bad = shares(rid, "a", batch=64, width=4)
    bad.shape[:] = [64, 2]
    with pytest.raises(RoundInputError, match=r"shape \(64, 4\)"):
        engine.receive_shares("a", bad)
    for p in links:
        engine.report_failure(p, rid, "test over")
    thread.join(timeout=10)
    assert refused and "nothing was charged" in str(refused[0])
    assert ledger.count_rounds(RoundState.ABORTED) == 1


def test_a_live_link_is_not_taken_over_but_a_dead_or_silent_one_is(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "l.db"))
    ledger.register_party("a", 1.0)
    engine = RoundEngine(ledger, silent_after=0.5)
    open_rpcs = {"first": True}
    first = engine.attach("a", "ipv4:10.0.0.1:5000", active=lambda: open_rpcs["first"])
    with pytest.raises(DuplicateLinkError) as err:
        engine.attach("a", "ipv4:10.6.6.6:4444")
    assert err.value.connected_from == "ipv4:10.0.0.1:5000"
    assert first.outbox.empty() and engine.connected() == ["a"]
    # A stream whose RPC ended (the transport noticed) is replaced and told to stop.
    open_rpcs["first"] = False
    second = engine.attach("a", "ipv4:10.0.0.1:5001")
    assert first.outbox.get_nowait() is None
    # One that went silent past silent_after is replaced too (a host that lost power).
    time.sleep(0.6)
    third = engine.attach("a", "ipv4:10.0.0.1:5002")
    assert second.outbox.get_nowait() is None
    # The replaced stream closing later does not disconnect the party's new one.
    engine.detach(second)
    assert engine.connected() == ["a"] and third.alive(engine.silent_after)


def test_a_test_noise_shared_by_every_class_is_refused_before_anything_is_reserved(
    tmp_path: Path,
) -> None:
    """Issue 33: one test noise for all classes lets an offset make "answered" noiseless."""
    task = {
        **TASK,
        "mechanism": {"name": "confident-gnmax", "sigma": 2, "threshold": 3, "sigma1": 2},
    }
    ledger = Ledger(str(tmp_path / "s.db"))
    ledger.create_task("t", task)
    for p in ("a", "b"):
        ledger.register_party(p, 100.0)
    engine = RoundEngine(ledger, share_timeout=3.0)
    for p in ("a", "b"):
        engine.attach(p)
    req = request()
    req.header.config_hash = config_hash(task)
    with pytest.raises(RoundRequestError, match="robust-confident-gnmax"):
        engine.open_round("student", req, SID)
    assert ledger.count_rounds() == 0


@pytest.mark.parametrize(
    ("mechanism", "why"),
    [
        # A deviating student's looser job: less noise than the task's policy ...
        ({"name": "gnmax", "sigma": 1.0}, "is below the task's"),
        # ... no noise at all, under a mechanism that charges nothing per answer ...
        ({"name": "dp-trained"}, "cannot run dp-trained"),
        # ... or the task's mechanism over another label space.
        ({"name": "gnmax", "sigma": 9.0, "outputs": 4}, "over 4"),
    ],
)
def test_a_students_looser_mechanism_is_refused_before_anything_is_reserved(
    engine: RoundEngine, mechanism: dict[str, object], why: str
) -> None:
    """The job's mechanism arrives resolved; the guardian checks it once against the
    task's policy (the task's own or a tightening of it) and refuses anything else."""
    for p in ("a", "b", "c"):
        engine.attach(p)
    config = dict(mechanism)
    outputs = int(str(config.pop("outputs", TASK["num_classes"])))
    req = request()
    req.mechanism.CopyFrom(serde.mechanism_to_proto(from_config(config, outputs)))
    with pytest.raises(RequestError, match=why):
        engine.open_round("student", req, SID)
    assert engine.ledger.count_rounds() == 0
    # The task's own, or a tightening of it, is taken.
    req.mechanism.CopyFrom(
        serde.mechanism_to_proto(from_config({"name": "gnmax", "sigma": 7.5}, 3))
    )
    task, _ = engine._task(req)
    assert task.mechanism.params.model_dump() == {"sigma": 7.5}


def test_the_vote_check_excludes_an_invalid_vote_and_an_unprovable_party(tmp_path: Path) -> None:
    """Over 100 classes a 32-teacher party's statement (600 bits a query) is too large for
    a proof: it is never asked to vote; of two proven parties, the invalid one is left out."""
    classes, batch = 100, 4
    task = {**TASK, "num_classes": classes, "quorum": 1}
    ledger = Ledger(str(tmp_path / "v.db"))
    ledger.create_task("t", task)
    for p in ("a", "big", "mallory"):
        ledger.register_party(p, 100.0)
    engine = RoundEngine(ledger, share_timeout=3.0)
    links = {"a": engine.attach("a"), "big": engine.attach("big", teachers=32)}
    links["mallory"] = engine.attach("mallory")
    key = X25519PrivateKey.generate()
    req = request(batch)
    req.header.config_hash = config_hash(task)
    req.student_public_key = key.public_key().public_bytes_raw()
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.update(reply=engine.open_round("student", req, SID)))
    t.start()
    rid = 0
    for name in ("a", "mallory"):
        msg = next_work(links[name].outbox)
        assert msg is not None
        rid = msg.work.round_id
    assert links["big"].outbox.empty()
    pub = bytes(req.student_public_key)
    rel = VoteRelation(classes, 1)
    counts = {
        p: one_hot_votes(np.full(batch, i), classes).astype(np.int64)
        for i, p in enumerate(("a", "mallory"))
    }
    bits, proof, sealed = share_proven_votes(rel, counts["a"], None, pub, rid, "a")
    engine.receive_shares("a", serde.shares_to_proto(rid, bits, sealed_seed=sealed, proof=proof))
    stuffed = np.zeros((batch, classes), dtype=np.uint64)
    stuffed[:, 7] = 400
    seed = ring.new_seed()
    g_bits, g_proof = validity.guardian_shares(rel, stuffed, seed)
    engine.receive_shares(
        "mallory",
        serde.shares_to_proto(
            rid, g_bits, sealed_seed=seal(pub, seed, seed_context(rid, "mallory")), proof=g_proof
        ),
    )
    t.join(timeout=10)
    reply = box["reply"]
    assert isinstance(reply, guardian_pb2.OpenRoundReply) and len(reply.challenge) == 24
    # The student's side, as services.student.client does it.
    seeds = open_seeds(key, {s.party: bytes(s.sealed) for s in reply.seeds}, rid)
    challenge = validity.Challenge.from_bytes(bytes(reply.challenge))
    proven = ["a", "mallory"]
    s_bits, s_proof = {}, {}
    for p in proven:
        s_bits[p], s_proof[p] = validity.student_shares(seeds[p], rel, batch)
    mine = verifier_shares(dict.fromkeys(proven, rel), challenge, proven, s_bits, s_proof)
    header = common_pb2.Header(protocol_version=2, task="t", config_hash=config_hash(task))
    with pytest.raises(RoundInputError, match="proven parties"):
        engine.check_votes("student", SID, serde.vote_check_to_proto(header, rid, ["a"], mine))
    check = engine.check_votes("student", SID, serde.vote_check_to_proto(header, rid, proven, mine))
    assert list(check.included) == ["a"]
    reasons = {e.party: e.reason for e in check.excluded}
    assert "validity proof" in reasons["mallory"] and "fewer teachers" in reasons["big"]
    with pytest.raises(RoundInputError, match="checked already"):
        engine.check_votes("student", SID, serde.vote_check_to_proto(header, rid, proven, mine))
    student = proven_vote_sum({"a": rel}, s_bits, dict(check.vote_weights), student=True)
    rnd = engine.core._rounds[rid]
    assert rnd.guardian_sum is not None and rnd.used == ("a",)
    np.testing.assert_array_equal(rnd.guardian_sum + student, counts["a"])
    # A dispute between the student and mallory, recorded by the guardian that saw it fail.
    flagged = [e for e in ledger.audit_entries(50) if e.action == "dispute"]
    assert [
        (e.actor, e.detail["round"], e.detail["querier"], e.detail["party"]) for e in flagged
    ] == [("guardian", rid, "student", "mallory")]
