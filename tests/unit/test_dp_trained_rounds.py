"""DP-trained teachers on the cores: the dp-trained mechanism (no noise, no per-query
charge, the GNMax circuit's labels), the training's one charge in every ledger (the
guardian's and the party's, in memory and in SQL), the party refusing such rounds
unless its own ledger charged its training, and the guardian asking only attested
parties (refusing below quorum with nothing reserved)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import NDArray

from capc.mechanisms import MechanismError, from_config
from capc.mpc.session import LocalPair
from capc.privacy import accountants, events
from capc.privacy.dp_training import DpTraining, DpTrainingError, plan_training
from capc.privacy.randomness import SecureRandom
from capc.round import GuardianCore, MemoryLedger, QueryBatch, RoundRequest, RoundWork
from capc.round.errors import RoundRequestError, VoteRefusedError
from capc.round.memory_party_ledger import MemoryPartyLedger
from capc.round.messages import Settlement
from capc.round.party import PartyCore
from capc.round.training import Attestation, TrainingCharge, TrainingRefusedError, file_digest
from capc.task_config import TaskConfig, TaskError, config_hash
from services.answerer.ledger_port import SqlPartyLedger
from services.common.ledger import Ledger
from tests.unit.test_mechanisms_objects import check_round, make_round
from tests.unit.test_mechanisms_objects import pair as pair  # the fixture

DELTA = 1e-5
NAME = "hospital-a"
TASK: dict[str, object] = {
    "num_classes": 3,
    "input_shape": [2],
    "mechanism": {"name": "dp-trained"},
    "quorum": 2,
}
CONFIG = TaskConfig.parse("t", TASK, config_hash(TASK))
GDP = accountants.make(accountants.DEFAULT_ACCOUNTANT)


def record(epsilon: float = 2.0, steps: int = 50) -> DpTraining:
    return plan_training(epsilon, DELTA, steps, clip=1.0, records=100)


def attested(rec: DpTraining, files: tuple[bytes, ...] = (b"\x01" * 32,)) -> Attestation:
    recs = (rec,) * len(files)
    return Attestation(recs, file_digest(files, recs))


def eps(loss: NDArray[np.float64]) -> float:
    return GDP.spent(loss, DELTA).epsilon


# -- the mechanism ---------------------------------------------------------------------


def test_the_mechanism_adds_no_noise_and_charges_nothing() -> None:
    mech = from_config({"name": "dp-trained"}, 4)
    assert mech.trained_teachers_only and mech.offset_robust and not mech.confident
    assert events.is_noop(mech.worst_case(1000)) and events.is_noop(mech.per_query())
    noise = mech.draw_noise(5, SecureRandom.from_seed("unused"))
    assert set(noise) == {"eta2"} and not noise["eta2"].any()
    # Ties go to the lowest class, as in GNMax's circuit.
    labels, answered = mech.oracle(
        np.array([[1, 3, 3, 0], [2, 2, 2, 2]]), mech.draw_noise(2, SecureRandom.from_seed("unused"))
    )
    assert labels.tolist() == [1, 0] and answered.all()
    with pytest.raises(MechanismError, match="sigma"):
        from_config({"name": "dp-trained", "sigma": 1.0}, 4)
    with pytest.raises(MechanismError, match="cannot change it"):
        mech.tightened({"sigma": 2.0})


def test_the_garbled_circuit_gives_the_plain_argmax_ties_included(pair: LocalPair) -> None:
    mech = from_config({"name": "dp-trained"}, 4)
    rng = np.random.default_rng(7)
    r = make_round(mech, rng, 64, 6, np.ones(6), 0, None, False, "dp-trained")
    labels, answered = check_round(r, pair)  # the circuit equals the oracle
    assert answered.all()
    np.testing.assert_array_equal(labels, np.argmax(r.hist, axis=1))
    tied = (r.hist == r.hist.max(axis=1, keepdims=True)).sum(axis=1) > 1
    assert tied.any()  # the test has teeth: some queries are ties


def test_a_task_refuses_personalized_budgets_with_it() -> None:
    bad = {**TASK, "personalization": {"mode": "weighting"}}
    with pytest.raises(TaskError, match="charges nothing per query"):
        TaskConfig.parse("t", bad, config_hash(bad))


# -- the training's one charge, in every ledger ----------------------------------------


class Ledgers:
    """A party's ledger of each kind, with its charge, spend and audit actions."""

    charge: Callable[[Attestation], TrainingCharge]
    loss: Callable[[], NDArray[np.float64]]
    actions: Callable[[], list[str]]

    def __init__(self, kind: str, cap: float, tmp_path: Path) -> None:
        self.kind = kind
        if kind == "memory-party":
            mem = MemoryPartyLedger(NAME, cap, delta=DELTA)
            self.charge = mem.charge_training
            self.loss = lambda: mem.ledger.spent_loss(NAME)
            self.actions = lambda: [a.action for a in mem.ledger.audit]
        elif kind == "memory-guardian":
            g = MemoryLedger(delta=DELTA)
            g.register(NAME, cap)
            self.charge = lambda a: g.charge_training(NAME, a, actor=NAME)
            self.loss = lambda: g.spent_loss(NAME)
            self.actions = lambda: [a.action for a in g.audit]
        else:
            sql = Ledger(str(tmp_path / f"{kind}-{cap:g}.db"), delta=DELTA)
            sql.register_party(NAME, cap, actor=NAME)
            if kind == "sql-party":
                port = SqlPartyLedger(sql, NAME)
                self.charge = port.charge_training
            else:
                self.charge = lambda a: sql.charge_training(NAME, a, actor=NAME)
            self.loss = lambda: sql.spent_loss(NAME)
            self.actions = lambda: [e.action for e in sql.audit_entries(limit=1000)]
            self.sql = sql


KINDS = ["memory-party", "memory-guardian", "sql-party", "sql-guardian"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_training_is_charged_once_per_digest(kind: str, tmp_path: Path) -> None:
    led = Ledgers(kind, 10.0, tmp_path)
    rec = record(2.0)
    first = led.charge(attested(rec))
    assert first.charged
    # The charge is the record's event, exactly: the training's own epsilon.
    want = GDP.filter_cost(rec.event())
    np.testing.assert_allclose(led.loss(), want, rtol=1e-12)
    assert first.epsilon == pytest.approx(rec.spent(DELTA), rel=1e-9)
    assert first.epsilon <= 2.0
    # The same files again (a restart): nothing more.
    again = led.charge(attested(rec))
    assert not again.charged
    np.testing.assert_allclose(led.loss(), want, rtol=1e-12)
    assert led.actions().count("dp_training") == 1
    # A retrained teacher (other files): a new charge, composed with the first.
    other = led.charge(attested(rec, (b"\x02" * 32,)))
    assert other.charged
    np.testing.assert_allclose(led.loss(), 2 * want, rtol=1e-9)
    assert led.actions().count("dp_training") == 2


@pytest.mark.parametrize("kind", KINDS)
def test_a_training_past_the_cap_is_refused_with_nothing_charged(kind: str, tmp_path: Path) -> None:
    led = Ledgers(kind, 1.0, tmp_path)
    rec = record(2.0)
    with pytest.raises(TrainingRefusedError) as err:
        led.charge(attested(rec))
    assert err.value.cap == pytest.approx(1.0)
    assert err.value.epsilon == pytest.approx(rec.spent(DELTA), rel=1e-9)
    assert "cap of 1 eps" in str(err.value) and "nothing was charged" in str(err.value)
    assert not led.loss().any()
    assert "dp_training" not in led.actions()
    # One that fits goes in; then the first still does not (what was spent counts).
    led.charge(attested(record(0.8)))
    with pytest.raises(TrainingRefusedError, match="has spent"):
        led.charge(attested(record(0.8), (b"\x03" * 32,)))
    assert eps(led.loss()) <= 1.0


def test_several_files_compose_their_records() -> None:
    a, b = record(1.0), record(2.0, steps=20)
    att = Attestation((a, b), file_digest([b"\x01" * 32, b"\x02" * 32], [a, b]))
    np.testing.assert_allclose(
        GDP.filter_cost(att.event()),
        GDP.filter_cost(a.event()) + GDP.filter_cost(b.event()),
        rtol=1e-12,
    )
    assert Attestation.from_dict(att.to_dict()) == att
    for bad in ({"records": [], "sha256": att.digest}, {"records": [a.to_dict()]}):
        with pytest.raises(DpTrainingError):
            Attestation.from_dict(bad)
    with pytest.raises(DpTrainingError, match="hex"):
        Attestation((a,), "ZZ" * 32)


# -- the party and the guardian --------------------------------------------------------

KEY = X25519PrivateKey.generate().public_key().public_bytes_raw()


def work(round_id: int, party: str = NAME, batch: int = 6) -> RoundWork:
    return RoundWork(
        round_id,
        party,
        CONFIG.mechanism,
        KEY,
        1.0,
        CONFIG.frac_bits,
        1,
        None,
        QueryBatch("tensor", batch),
        "t",
        TASK,
    )


@pytest.mark.parametrize("kind", ["memory", "sql"])
def test_a_party_votes_in_such_rounds_only_once_its_training_is_charged(
    kind: str, tmp_path: Path
) -> None:
    if kind == "memory":
        mem = MemoryPartyLedger(NAME, 5.0, delta=DELTA)
        core = PartyCore(NAME, mem)

        def loss() -> NDArray[np.float64]:
            return mem.ledger.spent_loss(NAME)

    else:
        sql = Ledger(str(tmp_path / "own.db"), delta=DELTA)
        sql.register_party(NAME, 5.0, actor=NAME)
        port = SqlPartyLedger(sql, NAME)
        core = PartyCore(NAME, port)

        def loss() -> NDArray[np.float64]:
            port.flush()
            return sql.spent_loss(NAME)

    with pytest.raises(VoteRefusedError, match="only DP-trained teachers"):
        core.admit(work(1))
    assert not loss().any()
    core.attest(attested(record(2.0)))
    trained = loss().copy()
    assert trained.any()
    predictions = np.array([[0], [1], [2], [0], [1], [2]])
    for rid in range(2, 12):
        w = work(rid)
        core.admit(w)
        core.vote(w, predictions, 3)
        packed = np.packbits(np.ones(6, dtype=bool), bitorder="little").tobytes()
        assert core.settle(Settlement(rid, NAME, "charged", packed))
    # Ten rounds, nothing more (a settlement rounds its total up by an ulp or two).
    np.testing.assert_allclose(loss(), trained, rtol=1e-12)


def test_the_guardian_asks_only_attested_parties_and_refuses_below_quorum() -> None:
    ledger = MemoryLedger(delta=DELTA)
    for p in ("a", "b", "c"):
        ledger.register(p, 5.0)
    core: GuardianCore[TaskConfig] = GuardianCore(ledger, round_timeout=60.0)

    def request(key: str) -> RoundRequest:
        return RoundRequest(key, "student", QueryBatch("tensor", 4), KEY)

    teachers = {"a": 1, "b": 1, "c": 1}
    with pytest.raises(RoundRequestError, match="only hospitals whose every voting teacher") as e:
        core.open(CONFIG, request("r1"), ["a", "b", "c"], teachers, 0.0, trained={"a"})
    assert "b, c did not" in str(e.value) and "nothing was reserved" in str(e.value)
    assert not ledger.audit  # nothing reserved
    rnd, sent = core.open(CONFIG, request("r2"), ["a", "b", "c"], teachers, 0.0, trained={"a", "c"})
    assert rnd.included == ("a", "c") and [w.party for w in sent] == ["a", "c"]
    assert not any(ledger.spent_loss(p).any() for p in "abc")  # reserved: nothing
