"""The central driver (capc.round.central): the three roles in one process.

Its labels are the mechanism's oracle on the parties' summed votes with the
guardian's noise, through the real garbled circuit or the oracle; its ledgers
follow the same rules as the networked services' (tests/e2e/test_central_driver.py
runs both side by side).
"""

from __future__ import annotations

import numpy as np
import pytest

from capc.learning.pate import ConfidentParams, label_within_budgets
from capc.mechanisms import from_config
from capc.privacy.randomness import SecureRandom
from capc.round.central import MODES, CentralDriver, Mode, label_histograms, oracle_release
from capc.round.errors import QuorumError, RoundRefusedError
from capc.round.memory_party_ledger import MemoryPartyLedger
from capc.round.task import MechanismTask

CLASSES = 4
ROBUST = from_config(
    {"name": "robust-confident-gnmax", "sigma": 1.5, "threshold": 3.0, "sigma1": 1.0}, CLASSES
)
TASK = MechanismTask("t", ROBUST, quorum=2)
PARTIES = ("a", "b", "c")


def predictions(batch: int, teachers: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """Each party's teachers' classes (B, m), mostly agreeing on a class per query."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, CLASSES, batch)
    out = {}
    for p in PARTIES:
        votes = np.repeat(truth[:, None], teachers, axis=1)
        flip = rng.random(votes.shape) < 0.2
        votes[flip] = rng.integers(0, CLASSES, int(flip.sum()))
        out[p] = votes
    return out


def expected(preds: dict[str, np.ndarray], seed: str) -> tuple[np.ndarray, np.ndarray]:
    """The oracle on the summed votes with the guardian's noise from ``seed``."""
    hist = sum(ROBUST.summed_votes(v) for v in preds.values())
    assert isinstance(hist, np.ndarray)
    noise = ROBUST.draw_noise(len(hist), SecureRandom.from_seed(seed))
    teachers = sum(v.shape[1] for v in preds.values())
    spec = TASK.circuit_spec(teachers)
    return ROBUST.oracle(hist, noise, spec.frac_bits)


@pytest.mark.parametrize("mode", MODES)
def test_a_round_labels_as_the_oracle_and_every_ledger_is_charged_what_it_released(
    mode: Mode,
) -> None:
    caps = dict.fromkeys(PARTIES, 100.0)
    driver = CentralDriver(TASK, caps, rng=SecureRandom.from_seed("s"), mode=mode)
    preds = predictions(24)
    done = driver.label(preds)
    labels, answered = expected(preds, "s")
    np.testing.assert_array_equal(done.labels, labels)
    np.testing.assert_array_equal(done.answered, answered)
    assert done.parties == PARTIES and 0 < answered.sum() < len(answered)
    acct = driver.ledger.accounting
    charge = acct.filter_cost(ROBUST.event(answered))
    for p in PARTIES:
        # The guardian's ledger and the party's own agree on the actual charge.
        np.testing.assert_allclose(driver.ledger.spent_loss(p), charge, rtol=1e-12)
        own = driver.parties[p].ledger
        assert isinstance(own, MemoryPartyLedger) and own.open_rounds() == []
        np.testing.assert_allclose(own.ledger.spent_loss(p), charge, rtol=1e-12)


def test_two_party_and_oracle_modes_agree_round_after_round() -> None:
    caps = dict.fromkeys(PARTIES, 1e3)
    by = {
        mode: CentralDriver(TASK, caps, rng=SecureRandom.from_seed("r"), mode=mode)
        for mode in MODES
    }
    for k, batch in enumerate((7, 16, 3)):
        preds = predictions(batch, seed=k)
        two, oracle = (by[m].label(preds) for m in ("2pc", "oracle"))
        np.testing.assert_array_equal(two.labels, oracle.labels)
        np.testing.assert_array_equal(two.answered, oracle.answered)
    np.testing.assert_array_equal(
        by["2pc"].ledger.spent_loss("a"), by["oracle"].ledger.spent_loss("a")
    )


def test_a_party_past_its_own_cap_refuses_and_below_quorum_nothing_is_spent() -> None:
    caps = dict.fromkeys(PARTIES, 100.0)
    # c's own cap covers no round, whatever the guardian's ledger holds for it.
    driver = CentralDriver(TASK, caps, own_caps={"c": 1e-3}, rng=SecureRandom.from_seed("q"))
    done = driver.label(predictions(8))
    assert done.parties == ("a", "b") and "past its cap" in done.refused["c"]
    assert not driver.ledger.spent_loss("c").any()
    assert driver.parties["c"].ledger.open_rounds() == []
    # With b's own cap gone too, two of three refuse: the round is aborted below quorum and
    # nobody is charged for it, in any ledger.
    tight = CentralDriver(
        TASK, caps, own_caps={"b": 1e-3, "c": 1e-3}, rng=SecureRandom.from_seed("q")
    )
    with pytest.raises(RoundRefusedError, match="quorum 2"):
        tight.label(predictions(8))
    for p in PARTIES:
        assert not tight.ledger.spent_loss(p).any()
        assert tight.parties[p].ledger.open_rounds() == []
    # The guardian's own ledger refuses first when its caps cannot cover the round.
    poor = CentralDriver(TASK, dict.fromkeys(PARTIES, 1e-3))
    with pytest.raises(QuorumError):
        poor.label(predictions(8))
    assert all(poor.parties[p].ledger.open_rounds() == [] for p in PARTIES)


def test_rounds_are_refused_for_votes_of_the_wrong_shape_or_party() -> None:
    driver = CentralDriver(TASK, dict.fromkeys(PARTIES, 100.0))
    preds = predictions(6)
    with pytest.raises(ValueError, match="same B"):
        driver.label({**preds, "c": preds["c"][:5]})
    with pytest.raises(ValueError, match="no answering party"):
        driver.label({**preds, "mallory": preds["a"]})
    # A party whose vote fails mid-round: the round is aborted, nothing stays reserved.
    with pytest.raises(ValueError, match="predictions must lie in"):
        driver.label({**preds, "c": preds["c"] + CLASSES})
    assert driver.ledger.open_rounds() == []
    for p in PARTIES:
        assert not driver.ledger.spent_loss(p).any()
        assert driver.parties[p].ledger.open_rounds() == []


PARAMS = ConfidentParams(threshold=30.0, sigma1=20.0, sigma2=6.0)


def histograms(n: int, teachers: int = 50, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    top = rng.integers(10, teachers + 1, n)
    hist = np.zeros((n, 10))
    cls = rng.integers(0, 10, n)
    hist[np.arange(n), cls] = top
    other = (cls + 1 + rng.integers(0, 9, n)) % 10
    hist[np.arange(n), other] += teachers - top
    return hist


@pytest.mark.parametrize(
    "params", [PARAMS, ConfidentParams(None, 1.0, 6.0)], ids=["confident-gnmax", "gnmax"]
)
def test_central_labelling_through_the_protocol_changes_no_result(params: ConfidentParams) -> None:
    """``label_within_budgets(labels_by="2pc")``: the runs (labels, stops, epsilons and the
    sanitised side figure, which draws from the same stream after the labels) are those
    of the oracle, for a mechanism that is not offset-robust too (central mode)."""
    h = histograms(96)
    mech = params.mechanism(10)
    runs = {
        by: label_within_budgets(
            h,
            mech,
            [2.0, 8.0],
            1e-5,
            SecureRandom.from_seed("p"),
            num_teachers=50,
            accountants=("rdp", "gdp"),
            labels_by=by,
        )
        for by in ("oracle", "2pc")
    }
    for a, b in zip(runs["oracle"], runs["2pc"], strict=True):
        np.testing.assert_array_equal(a.labels, b.labels)
        assert (a.budget, a.processed, a.epsilon, a.accountant) == (
            b.budget,
            b.processed,
            b.epsilon,
            b.accountant,
        )
        np.testing.assert_equal(
            (a.order, a.sanitised_data_dependent_epsilon),
            (b.order, b.sanitised_data_dependent_epsilon),
        )
    assert 0 < runs["2pc"][0].processed < runs["2pc"][1].processed


def test_label_histograms_takes_whole_votes_of_its_teachers_only() -> None:
    mech = PARAMS.mechanism(10)
    h = histograms(8)
    rng = SecureRandom.from_seed("h")
    with pytest.raises(ValueError, match="integers"):
        label_histograms(h + 0.5, mech, 50, rng)
    with pytest.raises(ValueError, match="total the 50 teachers"):
        label_histograms(h[:, :] * 0 + np.eye(10)[:8] * 49, mech, 50, rng)
    with pytest.raises(ValueError, match=r"\(N, 10\)"):
        label_histograms(h[:, :9], mech, 50, rng)
    with pytest.raises(ValueError, match="labels_by"):
        label_within_budgets(h, mech, [1.0], 1e-5, rng, num_teachers=50, labels_by="guess")


@pytest.mark.parametrize(
    "config",
    [
        {"name": "binary", "sigma": 1.0, "threshold": 1.0, "sigma1": 0.5},
        {"name": "tau", "sigma": 1.0, "tau": 1.2},
        {"name": "powerset", "sigma": 1.0},
    ],
    ids=["binary", "tau", "powerset"],
)
def test_multi_label_votes_label_as_the_circuit_at_half_the_teachers(
    config: dict[str, object],
) -> None:
    """Multi-label ensembles (the multi-label experiment's path): the oracle mode decides
    per label at half the teachers, as the circuit does, bit for bit, on the vote grid
    (tau's fractional votes included)."""
    mech = from_config(config, 3)
    preds = np.random.default_rng(2).integers(0, 2, (6, 5, 3))
    runs = {}
    for mode in MODES:
        driver = CentralDriver(
            MechanismTask("m", mech), {"e": 1e6}, rng=SecureRandom.from_seed("ml"), mode=mode
        )
        runs[mode] = driver.label({"e": preds})
    np.testing.assert_array_equal(runs["2pc"].labels, runs["oracle"].labels)
    np.testing.assert_array_equal(runs["2pc"].answered, runs["oracle"].answered)
    grid = 1 << mech.vote_grid_bits
    counts = mech.encode_ensemble_votes(preds, frac_bits=mech.vote_grid_bits) / grid
    theta = None if mech.name == "powerset" else 5 / 2.0
    want = oracle_release(counts, mech, SecureRandom.from_seed("ml"), decision_threshold=theta)
    np.testing.assert_array_equal(runs["oracle"].labels, want[0])
    # The same histogram as counts of the ensemble: the same round.
    labels, _ = label_histograms(counts, mech, 5, SecureRandom.from_seed("ml"), mode="oracle")
    np.testing.assert_array_equal(labels, want[0])
    if mech.vote_grid_bits:
        with pytest.raises(ValueError, match="on the grid"):
            label_histograms(counts + 2.0**-20, mech, 5, SecureRandom.from_seed("ml"))
