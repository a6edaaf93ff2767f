"""Central-mode labelling stops where a data-independent accountant says, whatever the votes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capc.learning.pate import ConfidentParams, label_within_budgets
from capc.mechanisms import MechanismError, from_config
from capc.mpc.session import LocalPair
from capc.privacy import events, gaussian_dp, planning, rdp
from capc.privacy.accountant import Accountant, Budget
from capc.privacy.accountants import GaussianDp
from capc.privacy.conversion import DEFAULT_ORDERS, convert
from capc.privacy.randomness import SecureRandom
from capc.round.central_budget import budget_filter

THRESHOLD = 30.0
PARAMS = ConfidentParams(threshold=THRESHOLD, sigma1=20.0, sigma2=6.0)
#: The mechanism objects the services run, over the 10 classes of :func:`histograms`.
MECH = PARAMS.mechanism(10)


def oracle(h: np.ndarray, params: ConfidentParams, seed: str) -> tuple[np.ndarray, np.ndarray]:
    """What a networked round releases for votes ``h`` with the guardian's noise seeded
    ``seed``: the e2e replay's oracle (tests/e2e/test_consortium.py)."""
    mech = params.mechanism(h.shape[1])
    noise = mech.draw_noise(len(h), SecureRandom.from_seed(seed))
    return mech.oracle(h, noise, mech.circuit(float(h.sum(axis=1).max())).frac_bits)


def histograms(n: int = 400, teachers: int = 50, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    top = rng.integers(10, teachers + 1, n)
    hist = np.zeros((n, 10))
    cls = rng.integers(0, 10, n)
    hist[np.arange(n), cls] = top
    rest = teachers - top
    other = (cls + 1 + rng.integers(0, 9, n)) % 10
    hist[np.arange(n), other] += rest
    return hist


def filter_by_accountant(
    answered: np.ndarray, params: ConfidentParams, budget: float, delta: float
) -> tuple[int, Accountant]:
    """The stop an :class:`Accountant` refusing data-independent events over ``budget`` gives,
    one mechanism at a time: the test, then (if answered) the answer."""
    acc = Accountant("central")
    limit = Budget(budget, delta)
    for i, was_answered in enumerate(answered):
        steps = [] if params.threshold is None else [events.GaussianEvent(1.0, params.sigma1)]
        if was_answered:
            steps.append(events.GaussianEvent(math.sqrt(2.0), params.sigma2))
        for e in steps:
            if acc.would_exceed(e, limit):
                return i, acc
            acc.compose(e, budget=limit)
    return len(answered), acc


def test_runs_stop_where_the_data_independent_accountant_refuses_the_next_charge() -> None:
    h = histograms()
    budgets = [1.0, 3.0, 6.0]
    runs = label_within_budgets(
        h, MECH, budgets, 1e-5, SecureRandom.from_seed("t"), num_teachers=50
    )
    labels, answered = oracle(h, PARAMS, "t")
    assert 0 < runs[0].processed < runs[1].processed < runs[2].processed < len(h)
    for run in runs:
        # The labels are the mechanism's, up to where the run stopped.
        np.testing.assert_array_equal(run.labels[: run.processed], labels[: run.processed])
        assert (run.labels[run.processed :] == -1).all()
        stop, acc = filter_by_accountant(answered, PARAMS, run.budget, 1e-5)
        assert run.processed == stop
        spent = acc.spent(1e-5)
        assert not acc.report(1e-5).data_dependent
        assert run.epsilon == pytest.approx(spent.epsilon, rel=1e-12)
        assert run.order == spent.order
        assert run.epsilon <= run.budget
        # the side figure is released (noisy), never the stop rule
        assert math.isfinite(run.sanitised_data_dependent_epsilon)
        assert run.sanitised_data_dependent_epsilon > 0


def test_the_filter_charges_an_unanswered_query_its_test_only() -> None:
    orders = DEFAULT_ORDERS
    answered = np.array([True, False, False, True] * 50)
    run = budget_filter(answered, MECH, 2.0, 1e-5)
    tests = rdp.threshold_data_independent(PARAMS.sigma1, orders)
    answers = rdp.gnmax_data_independent(PARAMS.sigma2, orders)
    done = answered[: run.processed]
    charged = run.processed * tests + int(done.sum()) * answers
    # the stopping query's test is spent when it fitted: its outcome shows in the stop
    next_test_fits = convert(charged + tests, orders, 1e-5).epsilon <= 2.0
    expected = charged + tests if next_test_fits else charged
    np.testing.assert_allclose(run.spent, expected, rtol=1e-12)
    assert convert(run.spent, orders, 1e-5).epsilon <= 2.0
    # answering every query would have stopped sooner
    assert budget_filter(np.ones(200, dtype=bool), MECH, 2.0, 1e-5).processed < run.processed


def neighbours(n: int = 400, teachers: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Two vote sets that differ in one teacher's vote on every query.

    The teacher moves from the third class to the runner-up: the top count, so every
    threshold test's outcome under the same noise, is unchanged, while the top-two gap
    (6-11 votes), and with it the data-dependent GNMax bound, shrinks.
    """
    rng = np.random.default_rng(7)
    top = 24
    second = top - rng.integers(6, 12, n)
    h = np.zeros((n, 10))
    h[:, 0], h[:, 1], h[:, 2] = top, second, teachers - top - second
    g = h.copy()
    g[:, 2] -= 1
    g[:, 1] += 1
    return h, g


@pytest.mark.parametrize(
    "params", [ConfidentParams(None, 1.0, 2.0), ConfidentParams(20.0, 10.0, 2.0)]
)
def test_neighbouring_votes_release_the_same_number_of_labels(params: ConfidentParams) -> None:
    h, g = neighbours()
    # The data-dependent epsilon tells the neighbours apart: a stop decided by it would too.
    dd = [
        convert(
            sum(rdp.gnmax_data_dependent(v, params.sigma2, DEFAULT_ORDERS) for v in x[:20]),
            DEFAULT_ORDERS,
            1e-5,
        )
        for x in (h, g)
    ]
    assert abs(dd[0].epsilon - dd[1].epsilon) > 0.1
    budgets = [5.0, 10.0, 20.0]
    runs = [
        label_within_budgets(
            x, params.mechanism(10), budgets, 1e-5, SecureRandom.from_seed("n"), num_teachers=50
        )
        for x in (h, g)
    ]
    for a, b in zip(*runs, strict=True):
        assert a.processed == b.processed > 0
        np.testing.assert_array_equal(a.answered, b.answered)
        assert a.epsilon == b.epsilon and a.order == b.order


def test_params_scale_and_refuse_nonsense() -> None:
    assert PARAMS.scaled(100, reference=50) == ConfidentParams(60.0, 40.0, 12.0)
    with pytest.raises(ValueError, match="positive"):
        ConfidentParams(10.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        label_within_budgets(histograms(10), MECH, [0.0], 1e-5, SecureRandom(), num_teachers=50)
    # A mechanism without the data-dependent analysis of the side figure is refused by name.
    robust = from_config(
        {"name": "robust-confident-gnmax", "sigma": 6.0, "threshold": 30.0, "sigma1": 20.0}, 10
    )
    with pytest.raises(MechanismError, match="central labelling runs gnmax or confident-gnmax"):
        label_within_budgets(histograms(10), robust, [1.0], 1e-5, SecureRandom(), num_teachers=50)


def test_a_budget_too_small_for_one_query_labels_nothing() -> None:
    (run,) = label_within_budgets(
        histograms(20), MECH, [1e-6], 1e-5, SecureRandom(), num_teachers=50
    )
    assert run.processed == 0 and not run.answered.any()
    assert run.epsilon == 0.0 and math.isnan(run.sanitised_data_dependent_epsilon)


PLAIN = ConfidentParams(threshold=None, sigma1=1.0, sigma2=6.0)


def test_plain_gnmax_by_rdp_answers_what_the_data_independent_plan_allows() -> None:
    per_query = rdp.gnmax_data_independent(PLAIN.sigma2, DEFAULT_ORDERS)
    fit = planning.max_queries(per_query, DEFAULT_ORDERS, 3.0, 1e-5)
    for seed in range(2):
        h = histograms(seed=seed)
        (run,) = label_within_budgets(
            h, PLAIN.mechanism(10), [3.0], 1e-5, SecureRandom.from_seed("p"), num_teachers=50
        )
        labels, _ = oracle(h, PLAIN, "p")
        assert run.processed == fit and run.accountant == "rdp"
        np.testing.assert_array_equal(run.labels[: run.processed], labels[: run.processed])
        spent = planning.epsilon_after(per_query, DEFAULT_ORDERS, fit, 1e-5)
        assert run.epsilon == pytest.approx(spent.epsilon, rel=1e-12) and run.epsilon <= 3.0


def test_the_diet_configuration_admits_2849_labels_by_rdp_and_3201_by_gdp() -> None:
    # 250 teachers, sigma2 40 votes, eps 10 at delta 1e-5: what docs/diet.md cites.
    h = np.zeros((4096, 10))
    h[:, 0], h[:, 1] = 200, 50
    rdp_run, gdp_run = label_within_budgets(
        h,
        ConfidentParams(None, 1.0, 40.0).mechanism(10),
        [10.0],
        1e-5,
        SecureRandom.from_seed("d"),
        num_teachers=250,
        accountants=("rdp", "gdp"),
    )
    assert (rdp_run.processed, gdp_run.processed) == (2849, 3201)


def test_the_gdp_accountant_stops_where_the_exact_bound_says_whatever_the_votes() -> None:
    budgets = [1.0, 3.0]
    stops = set()
    for seed in range(3):
        h = histograms(seed=seed)
        runs = label_within_budgets(
            h,
            PLAIN.mechanism(10),
            budgets,
            1e-5,
            SecureRandom.from_seed("g"),
            num_teachers=50,
            accountants=("rdp", "gdp"),
        )
        by_rdp, by_gdp = runs[:2], runs[2:]
        labels, _ = oracle(h, PLAIN, "g")
        for r, g in zip(by_rdp, by_gdp, strict=True):
            assert g.accountant == "gdp" and g.budget == r.budget
            # One draw: the accountants differ only in where they stop.
            np.testing.assert_array_equal(g.labels[: g.processed], labels[: g.processed])
            assert (g.labels[g.processed :] == -1).all()
            per_query = gaussian_dp.gnmax_mu(PLAIN.sigma2)
            assert g.processed == gaussian_dp.max_queries_gdp(per_query, g.budget, 1e-5)
            assert g.epsilon <= g.budget == r.budget
            # data-independent: nothing to sanitise
            assert math.isnan(g.sanitised_data_dependent_epsilon) and math.isnan(g.order)
            # exact composition answers at least what the data-independent RDP bound allows
            assert g.processed >= r.processed
            stops.add((g.budget, g.processed, r.processed))
    assert len(stops) == len(budgets)  # the same stops for every histogram


def test_the_gdp_accountant_filters_confident_gnmax_and_unknown_accountants_fail() -> None:
    h = histograms(400)
    rdp_run, gdp_run = label_within_budgets(
        h,
        MECH,
        [3.0],
        1e-5,
        SecureRandom.from_seed("c"),
        num_teachers=50,
        accountants=("rdp", "gdp"),
    )
    # Exact Gaussian DP is a filter under full adaptivity: it stops no earlier than RDP,
    # and its stop is what its own accountant allows, test by test.
    assert gdp_run.processed >= rdp_run.processed > 0
    _, answered = oracle(h, PARAMS, "c")
    run = budget_filter(answered, MECH, 3.0, 1e-5, GaussianDp())
    assert gdp_run.processed == run.processed
    assert gdp_run.epsilon == GaussianDp().spent(run.spent, 1e-5).epsilon <= 3.0
    with pytest.raises(ValueError, match="unknown accountants"):
        label_within_budgets(
            h,
            PLAIN.mechanism(10),
            [1.0],
            1e-5,
            SecureRandom(),
            num_teachers=50,
            accountants=("moments",),
        )
    assert PLAIN.scaled(200, reference=100) == ConfidentParams(None, 2.0, 12.0)
    with pytest.raises(ValueError, match="threshold >= 0"):
        ConfidentParams(-1.0, 1.0, 1.0)


#: Noise far below the circuit's grid (2**-4 votes), on exact ties: the label then turns on
#: how the noise is rounded, which only the circuit's own rounding reproduces.
ON_THE_GRID = ConfidentParams(threshold=None, sigma1=1.0, sigma2=0.05)


@pytest.mark.parametrize(
    "params", [PARAMS, PLAIN, ON_THE_GRID], ids=["confident-gnmax", "gnmax", "on-the-grid"]
)
def test_central_labels_are_the_circuits_on_the_same_votes_and_noise(
    params: ConfidentParams,
) -> None:
    """The central driver and a networked round agree bit for bit: the same votes and the
    guardian's noise from the same seed, through the garbled circuit the services run
    (the student's and the guardian's shares of the votes, the guardian's inputs, the
    student's decoding), and the e2e tests' replay oracle."""
    h = histograms(64)
    h[:32] = 0.0
    h[:32, [3, 7]] = 25.0  # exact two-way ties
    mech = params.mechanism(10)
    (run,) = label_within_budgets(
        h, mech, [1e6], 1e-5, SecureRandom.from_seed("bit"), num_teachers=50
    )
    assert run.processed == len(h)
    spec = mech.circuit(max_votes=50.0, vote_total=50.0)
    noise = mech.draw_noise(len(h), SecureRandom.from_seed("bit"))
    shares = np.random.default_rng(0)
    student = shares.integers(0, 2**64 - 1, h.shape, dtype=np.uint64, endpoint=True)
    guardian = h.astype(np.uint64) - student  # additive shares mod 2**64
    garbler = mech.garbler_inputs(spec, guardian, noise, vote_total=h.sum(axis=1))
    out = LocalPair(timeout=60).run(spec.circuit(), garbler, spec.evaluator_inputs(student), len(h))
    np.testing.assert_array_equal(run.labels, mech.decode(spec, out.evaluator))
    np.testing.assert_array_equal(run.answered, mech.answered(spec, out.garbler, len(h)))
    labels, answered = oracle(h, params, "bit")
    np.testing.assert_array_equal(run.labels, labels)
    # Teeth: the noise decides labels (another seed gives others), and a test declines some.
    other, _ = oracle(h, params, "another seed")
    assert not np.array_equal(labels, other)
    assert 0 < answered.sum() < len(h) if mech.confident else answered.all()
    if params is ON_THE_GRID:
        # The plaintext mechanism on the raw float noise labels some ties otherwise.
        raw, _ = mech.decide(h, noise)
        assert not np.array_equal(raw[:32], labels[:32])
