"""The student's round rules, against its role alone (capc.round.student).

The guardian and the parties are their own cores here (no transport): a round is
opened, voted with proofs, checked and prepared for the 2PC exactly as over the
network, and the student's answers to a deviating guardian or party are checked.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mechanisms import from_config
from capc.mpc.votes import PartyInputError, UnopenableSeedError
from capc.privacy.randomness import SecureRandom
from capc.round import GuardianCore, MemoryLedger, Opened, QueryBatch, Retry, VoteVerdict
from capc.round.errors import RoundInputError
from capc.round.memory_party_ledger import MemoryPartyLedger
from capc.round.party import PartyCore
from capc.round.student import StudentCore, StudentRound
from capc.round.task import MechanismTask

CLASSES, BATCH = 3, 6
MECH = from_config(
    {"name": "robust-confident-gnmax", "sigma": 2.0, "threshold": 2.0, "sigma1": 1.0}, CLASSES
)
TASK = MechanismTask("t", MECH, quorum=2)
PARTIES = ("a", "b", "c")
SESSION = b"s" * 16


def student() -> StudentCore:
    return StudentCore("student", X25519PrivateKey.generate(), exclude=("own-hospital",))


def opened_round(
    me: StudentCore, votes: dict[str, np.ndarray] | None = None
) -> tuple[GuardianCore[MechanismTask], Opened]:
    """A round the guardian's core opened for ``me`` and collected: every party votes
    with one teacher, class ``votes[p]`` (default: class 1 on every query)."""
    ledger = MemoryLedger()
    for p in PARTIES:
        ledger.register(p, 1e3)
    guardian: GuardianCore[MechanismTask] = GuardianCore(
        ledger, round_timeout=60.0, rng=SecureRandom.from_seed(2)
    )
    request = me.request(QueryBatch("tensor", BATCH), session_id=SESSION)
    rnd, work = guardian.open(TASK, request, PARTIES, dict.fromkeys(PARTIES, 1), 0.0)
    for w in work:
        party = PartyCore(w.party, MemoryPartyLedger(w.party, 1e3))
        w = replace(w, task_config={"task": "t"})
        party.admit(w)
        classes = (votes or {}).get(w.party, np.ones(BATCH, dtype=np.int64))
        guardian.receive(party.vote(w, classes[:, None], CLASSES))
    return guardian, guardian.close(rnd.round_id)


def test_requests_have_fresh_keys_and_leave_out_who_the_student_leaves_out() -> None:
    me = student()
    first = me.request(QueryBatch("tensor", 4))
    again = me.request(QueryBatch("tensor", 4), Retry(7, "b", "its seed did not open"))
    assert first.round_key != again.round_key and first.student_public_key == me.public_key
    assert first.exclude == {"own-hospital"} and again.exclude == {"own-hospital", "b"}
    assert again.retry is not None and again.retry.round_id == 7


def test_a_proven_round_checks_every_vote_and_the_shares_make_the_histogram() -> None:
    me = student()
    votes = {"a": np.array([0, 1, 2, 0, 1, 2]), "b": np.ones(BATCH, dtype=np.int64)}
    guardian, opened = opened_round(me, votes)
    rnd = me.opened(TASK, opened, BATCH)
    parties, mine = me.vote_check(rnd)
    assert parties == list(PARTIES)
    guardian.vote_check_batch(opened.round_id, "student", SESSION, parties)
    verdict = guardian.check_votes(opened.round_id, mine)
    assert verdict.included == PARTIES and not verdict.excluded
    total = me.checked(rnd, verdict)
    g = guardian.to_compute(opened.round_id).guardian_sum
    assert g is not None
    hist = (g + total).astype(np.int64)
    want = sum(
        MECH.summed_votes(np.asarray(votes.get(p, np.ones(BATCH)))[:, None].astype(np.int64))
        for p in PARTIES
    )
    np.testing.assert_array_equal(hist, want)
    spec, inputs = me.evaluator_inputs(rnd, total)
    assert spec.circuit() is not None and inputs
    with pytest.raises(RoundInputError, match="checked already"):
        me.vote_check(rnd)


def test_a_guardian_naming_other_parties_or_seeds_is_refused() -> None:
    me = student()
    _, opened = opened_round(me)
    # Seeds for parties it did not use, or none for one it did.
    with pytest.raises(RoundInputError, match="seeds do not match"):
        me.opened(TASK, replace(opened, seeds={**opened.seeds, "mallory": b"x"}), BATCH)
    rnd = me.opened(TASK, opened, BATCH)
    me.vote_check(rnd)
    verdict = VoteVerdict(opened.round_id, PARTIES, {}, dict.fromkeys(PARTIES, 1), {})
    for bad in (
        replace(verdict, included=(*PARTIES, "mallory")),
        replace(verdict, vote_weights={"a": 1, "b": 1}),  # a valid party without a weight
        replace(verdict, round_id=opened.round_id + 1),
    ):
        with pytest.raises(RoundInputError, match="parties the round did not have"):
            me.checked(rnd, bad)
    # Teeth: the honest verdict goes through, once.
    me.checked(rnd, verdict)
    with pytest.raises(RoundInputError, match="no vote check"):
        me.checked(rnd, verdict)


def test_a_seed_that_does_not_open_names_its_party_and_is_retried_once() -> None:
    me = student()
    _, opened = opened_round(me)
    # b sealed its seed to another key: only b is named.
    other = student()
    _, elsewhere = opened_round(other)
    forged = replace(opened, seeds={**opened.seeds, "b": elsewhere.seeds["b"]})
    with pytest.raises(UnopenableSeedError) as err:
        me.opened(TASK, forged, BATCH)
    assert err.value.party == "b" and err.value.round_id == opened.round_id
    retry = me.retry_without(err.value, retried=False, encrypted=False)
    assert retry == Retry(opened.round_id, "b", str(err.value))
    assert me.retry_without(err.value, retried=True, encrypted=False) is None
    assert me.retry_without(err.value, retried=False, encrypted=True) is None
    assert me.retry_without(PartyInputError("b", 1, "bad"), retried=False, encrypted=False) is None


def test_shares_of_the_wrong_shape_get_a_clear_error() -> None:
    me = student()
    _, opened = opened_round(me)
    rnd = me.opened(TASK, opened, BATCH)
    for bad in (
        np.zeros((BATCH, CLASSES + 1), dtype=np.uint64),
        np.zeros((BATCH - 1, CLASSES), dtype=np.uint64),
        np.zeros((BATCH, CLASSES), dtype=np.float64),
    ):
        with pytest.raises(
            RoundInputError, match=r"takes the student's share as uint64 of shape \(6, 3\)"
        ):
            me.evaluator_inputs(rnd, bad)  # type: ignore[arg-type]
    # An encrypted round takes every party's share, (B, P, width), in the round's order.
    sealed = StudentRound(9, TASK, BATCH, PARTIES, dict.fromkeys(PARTIES, 1), {}, encrypted=True)
    with pytest.raises(RoundInputError, match=r"parties' shares as uint64 of shape \(6, 3, 3\)"):
        me.encrypted_sum(sealed, np.zeros((BATCH, 2, CLASSES), dtype=np.uint64))
    ok = me.encrypted_sum(sealed, np.zeros((BATCH, 3, CLASSES), dtype=np.uint64))
    spec, _ = me.evaluator_inputs(sealed, ok)
    assert spec.circuit() is not None
    with pytest.raises(RoundInputError, match="not a seed sum"):
        me.share_sum(rnd)
