"""The guardian's round rules, against the round core alone (capc.round).

No transport and no clock: the student, the parties and time are played here.
Most tests run on both ledgers behind the port, the in-memory one and the
guardian's SQL ledger (through its adapter), and check the ledger's numbers,
so a broken rule, or an in-memory ledger that strays from the SQL one, fails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

import capc.round.guardian as guardian_module
from capc.mpc import ring, validity
from capc.mpc.sealing import seal, seed_context
from capc.mpc.votes import (
    one_hot_votes,
    open_seeds,
    proven_vote_sum,
    share_proven_votes,
    verifier_shares,
)
from capc.privacy.randomness import SecureRandom
from capc.round import (
    GuardianCore,
    LimitError,
    MemoryLedger,
    Opened,
    PartyShares,
    QueryBatch,
    QuorumError,
    Retry,
    RoundLedger,
    RoundRefusedError,
    RoundRequest,
    RoundRequestError,
    RoundState,
    RoundView,
    RoundWork,
)
from capc.round.state import GuardianRound, Phase, PhaseError
from capc.task_config import TaskConfig, config_hash
from services.common.ledger import Ledger
from services.guardian.ledger_port import SqlRoundLedger

CLASSES, BATCH, TIMEOUT = 3, 4, 100.0
TASK = {
    "num_classes": CLASSES,
    "input_shape": [2],
    "mechanism": {"name": "gnmax", "sigma": 5.0},
    "quorum": 2,
}
CONFIG = TaskConfig.parse("t", TASK, config_hash(TASK))
RELATION = validity.VoteRelation(CLASSES, 1)
KEY = X25519PrivateKey.generate()
#: Parties able to afford many rounds, and one whose cap covers none.
RICH, POOR_CAP = 100.0, 1e-6


@dataclass
class Consortium:
    """A core over one of the two ledgers; ``spent``: a party's epsilon spent, open
    reservations counted, as its ledger reads it."""

    core: GuardianCore[TaskConfig]
    ledger: RoundLedger
    spent: Callable[[str], float]


@pytest.fixture(params=["memory", "sql"])
def consortium(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Consortium]:
    caps = {"a": RICH, "b": RICH, "c": RICH, "poor": POOR_CAP}
    if request.param == "memory":
        mem = MemoryLedger()
        for name, cap in caps.items():
            mem.register(name, cap)
        yield Consortium(_core(mem), mem, mem.spent)
        return
    sql = Ledger(str(tmp_path / "ledger.db"))
    sql.create_task("t", TASK)
    for name, cap in caps.items():
        sql.register_party(name, cap)
    port = SqlRoundLedger(sql)
    yield Consortium(_core(port), port, lambda n: sql.budget(n).spent)
    sql.close()


def _core(ledger: RoundLedger) -> GuardianCore[TaskConfig]:
    return GuardianCore(ledger, round_timeout=TIMEOUT, rng=SecureRandom.from_seed(7))


def request(key: str, *, exclude: tuple[str, ...] = (), retry: Retry | None = None) -> RoundRequest:
    return RoundRequest(
        key,
        "student",
        QueryBatch("tensor", BATCH),
        KEY.public_key().public_bytes_raw(),
        b"s" * 16,
        frozenset(exclude),
        retry=retry,
    )


def open_round(
    c: Consortium, key: str, parties: tuple[str, ...] = ("a", "b", "c"), now: float = 0.0
) -> tuple[RoundView[TaskConfig], list[RoundWork]]:
    """Open a round of BATCH plain queries over ``parties`` (one teacher each) at ``now``."""
    return c.core.open(CONFIG, request(key), parties, dict.fromkeys(parties, 1), now)


def answer(c: Consortium, work: RoundWork, label: int = 0, stuffed: bool = False) -> bool:
    """Party ``work.party`` votes ``label`` on every query; ``stuffed``: its vote counts 2
    for that class (not a one-teacher vote), shared and sealed as an honest one."""
    counts = one_hot_votes(np.full(BATCH, label), CLASSES).astype(np.int64)
    pub = work.student_public_key
    if stuffed:
        bits = RELATION.encode(counts)
        bits[:, label] = 2
        seed = ring.new_seed()
        share, proof = validity.guardian_shares(RELATION, bits, seed)
        sealed = seal(pub, seed, seed_context(work.round_id, work.party))
    else:
        share, proof, sealed = share_proven_votes(
            RELATION, counts, None, pub, work.round_id, work.party
        )
    return c.core.receive(PartyShares(work.round_id, work.party, share, sealed, b"", proof))


def student_check(opened: Opened) -> validity.VerifierShare:
    """The honest student's verifier shares of the parties ``opened`` included."""
    parties = list(opened.included)
    seeds = open_seeds(KEY, dict(opened.seeds), opened.round_id)
    bits, proofs = {}, {}
    for p in parties:
        bits[p], proofs[p] = validity.student_shares(seeds[p], RELATION, BATCH)
    challenge = validity.Challenge.from_bytes(opened.challenge)
    return verifier_shares(dict.fromkeys(parties, RELATION), challenge, parties, bits, proofs)


def worst(c: Consortium, weight: float = 1.0) -> float:
    """Epsilon of one party's worst case for a round of BATCH queries, alone."""
    loss = c.ledger.accounting.filter_cost(CONFIG.mechanism.worst_case(BATCH, weight))
    return c.ledger.accounting.spent(loss, c.ledger.delta).epsilon


def run_to_release(c: Consortium, key: str) -> RoundView[TaskConfig]:
    """Open, answer, check and release a round of a, b and c."""
    rnd, work = open_round(c, key)
    for w in work:
        answer(c, w)
    opened = c.core.close(rnd.round_id)
    c.core.vote_check_batch(rnd.round_id, "student", b"s" * 16, list(opened.included))
    c.core.check_votes(rnd.round_id, student_check(opened))
    c.core.release(rnd.round_id)
    return rnd


def test_a_budget_that_cannot_cover_the_round_leaves_its_party_out_before_reserving(
    consortium: Consortium,
) -> None:
    c = consortium
    rnd, work = open_round(c, "k1", ("a", "b", "poor"))
    assert rnd.included == ("a", "b")
    assert set(rnd.excluded) == {"poor"} and rnd.excluded["poor"] <= POOR_CAP
    assert [w.party for w in work] == ["a", "b"], "no work goes to a party left out"
    assert c.spent("poor") == 0.0, "nothing was reserved for the party left out"
    for p in ("a", "b"):
        assert c.spent(p) == pytest.approx(worst(c), rel=1e-9)


def test_below_quorum_the_round_is_refused_and_nothing_is_spent(consortium: Consortium) -> None:
    c = consortium
    with pytest.raises(QuorumError) as err:
        open_round(c, "k1", ("a", "poor"))
    assert set(err.value.remaining) == {"poor"}
    assert not c.core.open_ids()
    assert all(c.spent(p) == 0.0 for p in ("a", "b", "c", "poor"))
    # Quorum lost while collecting: the round is aborted, its reservations come back.
    rnd, work = open_round(c, "k2")
    assert c.spent("a") > 0
    answer(c, work[0])
    with pytest.raises(RoundRefusedError, match="1 of 3 parties answered"):
        c.core.close(rnd.round_id)
    assert c.ledger.round_state(rnd.round_id) == RoundState.ABORTED
    assert all(c.spent(p) == 0.0 for p in ("a", "b", "c"))
    assert not c.core.is_open(rnd.round_id)


def test_an_abandoned_round_is_aborted_before_its_release_and_charged_its_worst_case_after(
    consortium: Consortium,
) -> None:
    c = consortium
    before, work = open_round(c, "k1")
    for w in work:
        answer(c, w)
    c.core.close(before.round_id)
    c.core.settle(before.round_id, "the student went away")
    assert c.ledger.round_state(before.round_id) == RoundState.ABORTED
    assert all(c.spent(p) == 0.0 for p in ("a", "b", "c"))

    after = run_to_release(c, "k2")
    c.core.settle(after.round_id, "the 2PC broke after the release")
    assert c.ledger.round_state(after.round_id) == RoundState.COMMITTED
    for p in ("a", "b", "c"):
        assert c.spent(p) == pytest.approx(worst(c), rel=1e-9), "over-count, never under"
    record = c.ledger.round_record(after.round_id)
    assert record is not None and record.outcome is None  # what it released is unknown
    # Settling again (a reaper or an ending session late) changes nothing.
    c.core.settle(after.round_id, "again")
    assert c.spent("a") == pytest.approx(worst(c), rel=1e-9)


def test_a_crash_charges_released_rounds_their_reservation_and_returns_the_others() -> None:
    ledger = MemoryLedger()
    for p in ("a", "b", "c"):
        ledger.register(p, RICH)
    c = Consortium(_core(ledger), ledger, ledger.spent)
    released = run_to_release(c, "k1")
    reserved, _ = open_round(c, "k2")
    held = c.spent("a")
    # The guardian crashes: its core is gone, the ledger is what is left.
    assert ledger.recover() == (1, 1)
    assert ledger.round_state(released.round_id) == RoundState.COMMITTED
    assert ledger.round_state(reserved.round_id) == RoundState.ABORTED
    assert c.spent("a") == pytest.approx(worst(c), rel=1e-9) and c.spent("a") < held
    assert ledger.open_rounds() == []


def test_a_failed_vote_check_leaves_that_party_out_and_the_others_are_charged_what_was_released(
    consortium: Consortium,
) -> None:
    c = consortium
    rnd, work = open_round(c, "k1")
    for w in work:
        answer(c, w, stuffed=w.party == "c")
    opened = c.core.close(rnd.round_id)
    assert opened.included == ("a", "b", "c") and len(opened.challenge) == 24
    c.core.vote_check_batch(rnd.round_id, "student", b"s" * 16, list(opened.included))
    verdict = c.core.check_votes(rnd.round_id, student_check(opened))
    assert verdict.included == ("a", "b") and set(verdict.excluded) == {"c"}
    now = c.core.view(rnd.round_id)
    assert now is not None and now.ready and now.guardian_sum is not None
    assert rnd.phase is Phase.COLLECTING, "a view is a snapshot: a later step never changes it"
    # The guardian's sum counts the valid votes only: 2 votes for class 0 on every query.
    seeds = open_seeds(KEY, dict(opened.seeds), rnd.round_id)
    student = proven_vote_sum(
        dict.fromkeys(("a", "b"), RELATION),
        {p: validity.student_shares(seeds[p], RELATION, BATCH)[0] for p in ("a", "b")},
        dict(verdict.vote_weights),
        student=True,
    )
    np.testing.assert_array_equal(now.guardian_sum + student, np.tile([2, 0, 0], (BATCH, 1)))
    assert [e for e in _audit(c) if e[0] == "dispute"] == [("dispute", "c")]

    c.core.release(rnd.round_id)
    spec = CONFIG.circuit_spec(2, 2.0)
    done = c.core.computed(rnd.round_id, spec, {})  # gnmax answers every query: no garbler output
    assert done.parties == ("a", "b") and done.answered == BATCH
    assert c.ledger.round_state(rnd.round_id) == RoundState.COMMITTED
    assert c.spent("c") == 0.0, "the party whose vote was left out pays nothing"
    for p in ("a", "b"):
        assert c.spent(p) == pytest.approx(worst(c), rel=1e-9)  # every query answered
    assert not c.core.is_open(rnd.round_id)


def _audit(c: Consortium) -> list[tuple[str, object]]:
    if isinstance(c.ledger, MemoryLedger):
        return [(e.action, e.detail.get("party")) for e in c.ledger.audit]
    assert isinstance(c.ledger, SqlRoundLedger)
    return [(e.action, e.detail.get("party")) for e in c.ledger.sql.audit_entries(100)]


def test_a_round_is_retried_without_a_party_once_and_never_after_it_was_computed(
    consortium: Consortium,
) -> None:
    c = consortium
    rnd, work = open_round(c, "k1")
    for w in work:
        answer(c, w)
    c.core.close(rnd.round_id)
    # The retry must leave the party out, and name a party whose seed the round sent.
    with pytest.raises(RoundRequestError, match="must leave it out"):
        c.core.retry_without(request("k2", retry=Retry(rnd.round_id, "c")))
    with pytest.raises(RoundRequestError, match="not a recent round"):
        c.core.retry_without(request("k2", exclude=("x",), retry=Retry(rnd.round_id, "x")))
    assert c.ledger.round_state(rnd.round_id) == RoundState.RESERVED
    retry = request("k2", exclude=("c",), retry=Retry(rnd.round_id, "c", "bad tag"))
    c.core.retry_without(retry)
    assert c.ledger.round_state(rnd.round_id) == RoundState.ABORTED
    assert all(c.spent(p) == 0.0 for p in ("a", "b", "c"))
    again, work = c.core.open(CONFIG, retry, ("a", "b", "c"), dict.fromkeys("abc", 1), 0.0)
    assert again.included == ("a", "b")
    with pytest.raises(RoundRequestError, match="retried already"):
        c.core.retry_without(request("k3", exclude=("b",), retry=Retry(rnd.round_id, "b")))
    # A computed round released its output: it is never answered again.
    for w in work:
        answer(c, w)
    opened = c.core.close(again.round_id)
    c.core.vote_check_batch(again.round_id, "student", b"s" * 16, list(opened.included))
    c.core.check_votes(again.round_id, student_check(opened))
    c.core.release(again.round_id)
    spent = c.spent("a")
    with pytest.raises(RoundRequestError, match="was computed"):
        c.core.retry_without(request("k4", exclude=("b",), retry=Retry(again.round_id, "b")))
    c.core.computed(again.round_id, CONFIG.circuit_spec(2, 2.0), {})
    with pytest.raises(RoundRequestError, match="was computed"):
        c.core.retry_without(request("k5", exclude=("b",), retry=Retry(again.round_id, "b")))
    assert c.spent("a") == pytest.approx(spent, rel=1e-9)
    assert [a for a, _ in _audit(c)].count("dispute") == 1


def test_the_reaper_aborts_exactly_the_rounds_past_their_deadline(
    consortium: Consortium,
) -> None:
    c = consortium
    old, _ = open_round(c, "k1", now=0.0)
    young, _ = open_round(c, "k2", now=50.0)
    released = run_to_release(c, "k3")  # opened at 0 too, but its output has left
    assert c.core.reap(now=TIMEOUT) == [], "not past the deadline at exactly the timeout"
    assert c.core.reap(now=TIMEOUT + 1.0) == [old.round_id]
    assert c.ledger.round_state(old.round_id) == RoundState.ABORTED
    assert c.ledger.round_state(young.round_id) == RoundState.RESERVED
    assert c.ledger.round_state(released.round_id) == RoundState.RELEASED
    assert set(c.core.open_ids()) == {young.round_id, released.round_id}
    assert c.core.reap(now=TIMEOUT + 51.0) == [young.round_id]
    assert c.core.reap(now=10 * TIMEOUT) == [], "a released round is never reaped"
    # A reaped round releases nothing: its 2PC is refused.
    with pytest.raises(RoundRefusedError, match="no longer open"):
        c.core.to_compute(old.round_id)


def test_a_querier_holds_at_most_its_open_rounds_and_is_refused_before_reserving(
    consortium: Consortium,
) -> None:
    c = consortium
    c.core.max_open = 2
    open_round(c, "k1")
    open_round(c, "k2")
    spent = c.spent("a")
    with pytest.raises(LimitError):
        open_round(c, "k3")
    assert c.spent("a") == spent


def _phase(c: Consortium, rnd: RoundView[TaskConfig]) -> Phase:
    """The round's phase, read afresh from the core (a view is a snapshot)."""
    now = c.core.view(rnd.round_id)
    assert now is not None
    return now.phase


def test_a_round_moves_only_forward_through_its_phases_and_says_where_it_stands(
    consortium: Consortium,
) -> None:
    """Each step asks for the phase it needs: late shares, a second close, a second vote
    check and a release before the check are refused with a PhaseError naming the
    round's phase, and nothing about the round changes."""
    c = consortium
    rnd, work = open_round(c, "k-phase")
    rid = rnd.round_id
    assert _phase(c, rnd) is Phase.COLLECTING
    with pytest.raises(PhaseError) as early:
        c.core.release(rid)  # nothing to release yet: the ledger is not asked
    assert early.value.found is Phase.COLLECTING and early.value.wanted == {Phase.READY}
    assert c.ledger.round_state(rid) == RoundState.RESERVED
    for w in work[:2]:
        answer(c, w)
    opened = c.core.close(rid)
    assert _phase(c, rnd) is Phase.CHECKING
    with pytest.raises(PhaseError, match="late shares"):
        answer(c, work[2])
    with pytest.raises(PhaseError, match="closed already"):
        c.core.close(rid)
    with pytest.raises(PhaseError):
        c.core.release(rid)
    c.core.vote_check_batch(rid, "student", b"s" * 16, list(opened.included))
    c.core.check_votes(rid, student_check(opened))
    assert _phase(c, rnd) is Phase.READY
    with pytest.raises(PhaseError, match="checked already"):
        c.core.vote_check_batch(rid, "student", b"s" * 16, list(opened.included))
    with pytest.raises(PhaseError, match="checked already"):
        c.core.check_votes(rid, student_check(opened))
    c.core.release(rid)
    released = c.core.view(rid)
    assert released is not None and released.phase is Phase.RELEASED
    with pytest.raises(PhaseError):
        c.core.release(rid)  # released once: a second release would be a second output
    # An adapter holds snapshots only: it cannot move a round, nor change what it holds.
    with pytest.raises(dataclasses.FrozenInstanceError):
        released.phase = Phase.COLLECTING  # type: ignore[misc]
    with pytest.raises(TypeError):
        released.excluded["a"] = 0.0  # type: ignore[index]
    assert released.guardian_sum is not None and not released.guardian_sum.flags.writeable
    state = GuardianRound(rid, CONFIG, "student", BATCH, ("a",), {}, 0.0)
    state.advance(Phase.READY)
    with pytest.raises(PhaseError):
        state.advance(Phase.COLLECTING)


def test_a_vote_check_that_cannot_be_verified_aborts_the_round_at_once(
    consortium: Consortium, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check that parses but breaks the verification (here: the verifier raising) ends
    the round there and then, nothing released or charged, rather than leaving it
    half-checked for the reaper."""
    c = consortium
    rnd, work = open_round(c, "k-broken-check")
    for w in work:
        answer(c, w)
    opened = c.core.close(rnd.round_id)
    c.core.vote_check_batch(rnd.round_id, "student", b"s" * 16, list(opened.included))

    def broken(*args: object, **kwargs: object) -> object:
        raise ValueError("a share of the wrong length")

    monkeypatch.setattr(guardian_module, "verifier_shares", broken)
    with pytest.raises(RoundRefusedError, match="could not be verified"):
        c.core.check_votes(rnd.round_id, student_check(opened))
    assert not c.core.is_open(rnd.round_id)
    assert c.ledger.round_state(rnd.round_id) == RoundState.ABORTED
    assert all(c.spent(p) == 0.0 for p in ("a", "b", "c"))


def test_who_votes_on_what_cannot_be_changed_through_a_view_or_a_work() -> None:
    """With vanishing, each party's (B,) mask decides what it is charged: the masks an
    adapter holds (a round's view, a party's work) are read-only, so no adapter can
    narrow the queries a party is charged for after its reservation."""
    task = {
        "num_labels": 2,
        "input_shape": [2],
        "mechanism": {"name": "powerset", "sigma": 100.0},
        "quorum": 2,
        "personalization": {"mode": "vanishing", "planned_queries": 100},
    }
    config = TaskConfig.parse("v", task, config_hash(task))
    mem = MemoryLedger()
    for name in ("a", "b", "c"):
        mem.register(name, RICH)
    core = _core(mem)
    rnd, work = core.open(config, request("k-masks"), ("a", "b", "c"), dict.fromkeys("abc", 1), 0)
    masks = [w.participation for w in work if w.participation is not None]
    masks += [m for m in rnd.votes_on.values()]
    assert masks
    for mask in masks:
        before = mask.copy()
        with pytest.raises(ValueError, match="read-only"):
            mask[:] = False
        assert np.array_equal(mask, before)
    live = core.view(rnd.round_id)
    assert live is not None
    assert {p: m.tolist() for p, m in live.votes_on.items()} == {
        p: m.tolist() for p, m in rnd.votes_on.items()
    }


def test_a_charge_the_ledger_fails_to_take_leaves_the_round_to_settle_at_its_reservation(
    consortium: Consortium, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger's write of a released round's charge fails: the round stays open and
    released (the reaper leaves it, nothing is released again), and the settle that
    follows charges every party its reservation, never less."""
    c = consortium
    rnd = run_to_release(c, "k-failed-write")
    rid = rnd.round_id

    def down(*args: object, **kwargs: object) -> None:
        raise OSError("the ledger's disk is gone")

    monkeypatch.setattr(c.ledger, "commit", down)
    with pytest.raises(OSError):
        c.core.charge(rid, np.ones(BATCH, dtype=bool))
    monkeypatch.undo()
    assert c.core.is_open(rid) and c.ledger.round_state(rid) == RoundState.RELEASED
    assert c.core.reap(now=10 * TIMEOUT) == []
    with pytest.raises(PhaseError):
        c.core.release(rid)
    c.core.settle(rid, "its charge was not written")
    assert not c.core.is_open(rid) and c.ledger.round_state(rid) == RoundState.COMMITTED
    for p in ("a", "b", "c"):
        assert c.spent(p) == pytest.approx(worst(c), rel=1e-9)
