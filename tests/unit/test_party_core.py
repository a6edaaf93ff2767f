"""An answering party's round rules, against the party's role alone (capc.round.party).

No transport, no models: the guardian's work and settlements and the teachers'
predictions are played here. Every ledger test runs on both of the party's own
ledgers behind the port, the in-memory one and the SQL one (through the answerer's
adapter), and checks the ledger's numbers, so a broken rule, or an in-memory ledger
that strays from the SQL one, fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import NDArray

from capc.mpc import validity
from capc.mpc.votes import open_seeds, proven_vote_sum, verifier_shares
from capc.privacy.randomness import SecureRandom
from capc.round import (
    GuardianCore,
    MemoryLedger,
    QueryBatch,
    RoundRequest,
    RoundWork,
    Settlement,
)
from capc.round.errors import RoundInputError, VoteRefusedError
from capc.round.ledger import KeptSetting, PartyLedger
from capc.round.memory_party_ledger import MemoryPartyLedger
from capc.round.party import PartyCore, Terms, pack_mask, terms_of
from capc.round.settlement import outcome
from capc.task_config import TaskConfig, config_hash
from services.answerer.ledger_port import SqlPartyLedger
from services.common.ledger import Ledger

NAME, CLASSES = "hospital-a", 3
TASK: dict[str, object] = {
    "num_classes": CLASSES,
    "input_shape": [2],
    "mechanism": {"name": "robust-confident-gnmax", "sigma": 2.0, "threshold": 2.0, "sigma1": 3.0},
    "quorum": 1,
}
CONFIG = TaskConfig.parse("t", TASK, config_hash(TASK))
MECH = CONFIG.mechanism
KEY = X25519PrivateKey.generate()
PUBLIC = KEY.public_key().public_bytes_raw()


@dataclass
class Party:
    """A party's core over one of its two ledgers; ``loss``: its ledger's loss vector."""

    core: PartyCore
    ledger: PartyLedger
    sql: Ledger | None = None

    def loss(self) -> NDArray[np.float64]:
        """What the ledger holds once the settlements the port holds are written."""
        if self.sql is not None:
            assert isinstance(self.ledger, SqlPartyLedger)
            self.ledger.flush()
            return self.sql.spent_loss(NAME)
        assert isinstance(self.ledger, MemoryPartyLedger)
        return self.ledger.ledger.spent_loss(NAME)


def _party(kind: str, tmp_path: Path, cap: float) -> Party:
    if kind == "memory":
        mem = MemoryPartyLedger(NAME, cap)
        return Party(PartyCore(NAME, mem), mem)
    sql = Ledger(str(tmp_path / f"own-{cap:g}.db"))
    sql.register_party(NAME, cap, actor=NAME)
    port = SqlPartyLedger(sql, NAME)
    return Party(PartyCore(NAME, port), port, sql)


@pytest.fixture(params=["memory", "sql"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def party(kind: str, tmp_path: Path) -> Iterator[Party]:
    p = _party(kind, tmp_path, 1e4)
    yield p
    if p.sql is not None:
        p.sql.close()


def work(
    round_id: int,
    batch: int = 8,
    *,
    weight: float = 1.0,
    voting: NDArray[np.bool_] | None = None,
    teachers: int = 1,
    kind: str = "tensor",
) -> RoundWork:
    """The work the guardian sends for round ``round_id``."""
    return RoundWork(
        round_id,
        NAME,
        MECH,
        PUBLIC,
        weight,
        CONFIG.frac_bits,
        teachers,
        voting,
        QueryBatch(kind, batch),  # type: ignore[arg-type]
        "t",
        TASK,
    )


def cost(party: Party, answered: NDArray[np.bool_], weight: float = 1.0) -> NDArray[np.float64]:
    return party.ledger.accounting.filter_cost(MECH.event(answered, weight))


def charged(round_id: int, answered: NDArray[np.bool_]) -> Settlement:
    """The guardian's word that round ``round_id`` released ``answered``."""
    packed = bytes.fromhex(str(outcome(answered)["answered"]))
    return Settlement(round_id, NAME, "charged", packed)


# -- the ledger ----------------------------------------------------------------------


@pytest.mark.parametrize(("weight", "vanishing"), [(1.0, False), (0.75, False), (1.0, True)])
def test_each_round_reserves_its_worst_case_and_is_charged_what_it_released(
    party: Party, weight: float, vanishing: bool
) -> None:
    rng = np.random.default_rng(3)
    expected = party.ledger.accounting.zero()
    for rid, batch in ((4, 16), (9, 5), (10, 33)):
        voting = rng.random(batch) < 0.6 if vanishing else None
        w = work(rid, batch, weight=weight, voting=voting)
        party.core.admit(w)
        mask = np.ones(batch, dtype=bool) if voting is None else voting
        worst = cost(party, np.ones(int(mask.sum()), dtype=bool), weight)
        assert party.core.open_rounds() == [rid]
        np.testing.assert_allclose(party.loss(), expected + worst, rtol=1e-12)
        answered = rng.random(batch) < 0.5
        assert party.core.settle(charged(rid, answered))
        # Charged on the queries it voted on only, at its weight.
        expected = expected + cost(party, answered[mask], weight)
        np.testing.assert_allclose(party.loss(), expected, rtol=1e-9)
        assert not party.core.settle(charged(rid, answered))  # settled once
    assert party.core.open_rounds() == [] and expected[0] > 0


def test_past_its_own_cap_a_party_refuses_with_nothing_spent(kind: str, tmp_path: Path) -> None:
    party = _party(kind, tmp_path, 4.0)
    with pytest.raises(VoteRefusedError) as refusal:
        party.core.admit(work(1, 64))
    assert refusal.value.budget and "past its cap of 4 eps" in str(refusal.value)
    assert party.core.open_rounds() == [] and not party.loss().any()
    # Teeth: a round that fits is admitted and spends.
    party.core.admit(work(2, 1))
    assert party.core.open_rounds() == [2] and party.loss().any()


def test_a_replayed_round_is_not_voted_twice(party: Party) -> None:
    w = work(3, 4)
    party.core.admit(w)
    spent = party.loss()
    with pytest.raises(VoteRefusedError, match="already voted in round 3"):
        party.core.admit(w)
    with pytest.raises(VoteRefusedError, match="already voted in round 3"):
        party.core.admit(replace(w, vote_weight=0.5))  # changed terms are the same round
    np.testing.assert_array_equal(party.loss(), spent)
    predictions = np.zeros((4, 1), dtype=np.int64)
    party.core.vote(w, predictions, CLASSES)
    # The shares leave once: the same work again, or work never admitted, is refused.
    with pytest.raises(VoteRefusedError, match="voted in already"):
        party.core.vote(w, predictions, CLASSES)
    with pytest.raises(VoteRefusedError, match="not admitted"):
        party.core.vote(work(4, 4), predictions, CLASSES)


def test_refusals_say_why_and_spend_nothing(party: Party) -> None:
    party.core.refusing = "the guardian's audit key changed"
    with pytest.raises(VoteRefusedError, match="audit key changed"):
        party.core.admit(work(1))
    party.core.refusing = None
    # An encrypted vote is a whole one-hot: charged at less it would be given for less.
    for weight, voting in ((0.5, None), (1.0, np.ones(8, dtype=bool))):
        with pytest.raises(VoteRefusedError, match="weight 1"):
            party.core.admit(work(1, weight=weight, voting=voting, kind="encrypted"))
    # The same task name with another configuration is refused, not silently accounted.
    party.core.admit(work(2))
    with pytest.raises(VoteRefusedError, match="another configuration"):
        party.core.admit(replace(work(5), task_config={**TASK, "quorum": 2}))
    assert party.core.open_rounds() == [2]
    np.testing.assert_allclose(party.loss(), cost(party, np.ones(8, dtype=bool)), rtol=1e-12)


def test_settlements_never_undercount(party: Party) -> None:
    for rid in (1, 2, 3, 4, 5):
        party.core.admit(work(rid, 10))
    worst = cost(party, np.ones(10, dtype=bool))
    # Not used: nothing. Released but unknown: the worst case.
    assert party.core.settle(Settlement(1, NAME, "not_charged"))
    assert party.core.settle(Settlement(2, NAME, "worst_case"))
    # A mask of the wrong length is refused: the reservation stays.
    assert not party.core.settle(Settlement(3, NAME, "charged", b"\x01"))
    # A guardian not taken at its word (its head did not check) settles nothing.
    assert not party.core.settle(Settlement(4, NAME, "not_charged"), lambda: None)
    # A believed settlement keeps the setting it is shown with in the same step.
    head = KeptSetting("guardian_head", '{"seq": 9}', actor=NAME, action="guardian_head")
    assert party.core.settle(Settlement(5, NAME, "not_charged"), lambda: head)
    # A round never reserved here is nothing to the party.
    assert not party.core.settle(Settlement(77, NAME, "not_charged"))
    assert party.core.open_rounds() == [3, 4]
    np.testing.assert_allclose(party.loss(), 3 * worst, rtol=1e-12)
    if party.sql is not None:
        assert party.sql.setting("guardian_head") == '{"seq": 9}'
    else:
        assert isinstance(party.ledger, MemoryPartyLedger)
        assert party.ledger.kept == {"guardian_head": '{"seq": 9}'}


# -- the vote ------------------------------------------------------------------------


def test_the_vote_is_proven_and_counted_by_the_guardians_vote_check() -> None:
    """The party's shares go through the guardian's core: its proof checks, and the two
    verifiers' shares of the valid votes sum to the party's teachers' votes."""
    ledger = MemoryLedger()
    ledger.register(NAME, 1e4)
    guardian: GuardianCore[TaskConfig] = GuardianCore(
        ledger, round_timeout=60.0, rng=SecureRandom.from_seed(1)
    )
    batch, teachers = 6, 3
    request = RoundRequest("k", "student", QueryBatch("tensor", batch), PUBLIC, b"s" * 16)
    rnd, (w,) = guardian.open(CONFIG, request, [NAME], {NAME: teachers}, 0.0)
    w = replace(w, task_config=TASK)
    own = PartyCore(NAME, MemoryPartyLedger(NAME, 1e4))
    own.admit(w)
    predictions = np.random.default_rng(0).integers(0, CLASSES, (batch, teachers))
    guardian.receive(own.vote(w, predictions, CLASSES))
    opened = guardian.close(rnd.round_id)
    relation = MECH.vote_relation(teachers)
    assert relation is not None
    seed = open_seeds(KEY, dict(opened.seeds), rnd.round_id)[NAME]
    bits, proof = validity.student_shares(seed, relation, batch)
    challenge = validity.Challenge.from_bytes(opened.challenge)
    mine = verifier_shares({NAME: relation}, challenge, [NAME], {NAME: bits}, {NAME: proof})
    guardian.vote_check_batch(rnd.round_id, "student", b"s" * 16, [NAME])
    verdict = guardian.check_votes(rnd.round_id, mine)
    assert verdict.included == (NAME,)
    student = proven_vote_sum({NAME: relation}, {NAME: bits}, verdict.vote_weights, student=True)
    # The round's view at opening holds no sum: the one after the check does.
    checked = guardian.view(rnd.round_id)
    assert checked is not None and checked.guardian_sum is not None
    histogram = (checked.guardian_sum + student).astype(np.int64)
    np.testing.assert_array_equal(histogram, MECH.summed_votes(predictions))


def test_a_vote_from_other_teachers_than_the_guardian_counts_is_refused(party: Party) -> None:
    w = work(1, 4, teachers=2)
    party.core.admit(w)
    with pytest.raises(RoundInputError, match="counts this party with 2 teachers"):
        party.core.vote(w, np.zeros((4, 3), dtype=np.int64), CLASSES)
    with pytest.raises(RoundInputError, match="are not"):
        party.core.vote(w, np.zeros((5, 2), dtype=np.int64), CLASSES)
    with pytest.raises(RoundInputError, match="counts of shape"):
        party.core.vote_counts(w, np.zeros((4, CLASSES + 1), dtype=np.int64), 2)
    # The round stays admitted until it is voted or forgotten; its reservation stays.
    shares = party.core.vote(w, np.zeros((4, 2), dtype=np.int64), CLASSES)
    assert shares.proof is not None and shares.sealed_seed
    party.core.forget(1)
    assert party.core.open_rounds() == [1]


def test_pack_mask_is_the_wire_format() -> None:
    from services.common.serde import participation_from_bytes, participation_to_bytes

    mask = np.random.default_rng(1).random(13) < 0.5
    assert pack_mask(mask) == participation_to_bytes(mask)
    back = participation_from_bytes(pack_mask(mask), 13)
    assert back is not None and np.array_equal(back, mask)


def test_terms_as_the_ledger_keeps_them_carry_every_field() -> None:
    """What a reservation keeps of its round (Terms.to_dict) names every field, as
    ``dataclasses.asdict`` would, so a settlement can rebuild the terms from it."""
    terms = Terms({"name": "gnmax", "sigma": 4.0}, CLASSES, 0.5, 8, pack_mask(None).hex())
    assert terms.to_dict() == asdict(terms)
    assert terms_of(terms.to_dict()) == terms
