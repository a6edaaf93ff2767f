"""Central-mode labelling stops before a budget is exceeded and charges exactly the events."""

from __future__ import annotations

import numpy as np
import pytest

from capc.learning.pate import ConfidentParams, label_within_budgets
from capc.mechanisms import MECHANISMS
from capc.privacy import gaussian_dp, planning, rdp
from capc.privacy.accountant import Accountant, Budget
from capc.privacy.accountants import UnsupportedEventError
from capc.privacy.conversion import DEFAULT_ORDERS
from capc.privacy.mechanisms import confident_gnmax, gnmax
from capc.privacy.randomness import SecureRandom

THRESHOLD = 30.0
PARAMS = ConfidentParams(threshold=THRESHOLD, sigma1=20.0, sigma2=6.0)
#: The same mechanism as an object: its data-dependent events are what a run is charged.
CONFIDENT = MECHANISMS["confident-gnmax"].from_params(
    10, {"sigma": PARAMS.sigma2, "threshold": THRESHOLD, "sigma1": PARAMS.sigma1}
)


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


def test_runs_stop_before_the_budget_and_charge_exactly_their_events() -> None:
    h = histograms()
    runs = label_within_budgets(
        h, PARAMS, [1.0, 3.0], 1e-5, SecureRandom.from_seed("t"), num_teachers=50
    )
    plain = confident_gnmax(h, THRESHOLD, PARAMS.sigma1, PARAMS.sigma2, SecureRandom.from_seed("t"))
    small, large = runs
    assert 0 < small.processed < large.processed <= len(h)
    for run in runs:
        # The labels are the mechanism's, up to where the run stopped.
        np.testing.assert_array_equal(run.labels[: run.processed], plain.labels[: run.processed])
        assert (run.labels[run.processed :] == -1).all()
        acc = Accountant("central")
        for i in range(run.processed):
            # Data-dependent curves are no filter charge (compose(budget=...) refuses them):
            # check by hand that no prefix of the run went over its budget.
            acc.compose(
                CONFIDENT.data_dependent_event(h[i], bool(plain.answered[i]), DEFAULT_ORDERS)
            )
            assert acc.spent(1e-5).epsilon <= run.budget
        spent = acc.spent(1e-5)
        assert run.epsilon == pytest.approx(spent.epsilon, rel=1e-9)
        assert run.epsilon <= run.budget
        if run.processed < len(h):
            # The next query would have gone over: the run had to stop there.
            nxt = run.processed
            acc.compose(
                CONFIDENT.data_dependent_event(h[nxt], bool(plain.answered[nxt]), DEFAULT_ORDERS)
            )
            assert acc.spent(1e-5).epsilon > run.budget
        with pytest.raises(UnsupportedEventError, match="budget filter"):
            acc.compose(
                CONFIDENT.data_dependent_event(h[0], True, DEFAULT_ORDERS),
                budget=Budget(run.budget, 1e-5),
            )
        assert run.sanitised_epsilon > 0


def test_params_scale_and_refuse_nonsense() -> None:
    assert PARAMS.scaled(100, reference=50) == ConfidentParams(60.0, 40.0, 12.0)
    with pytest.raises(ValueError, match="positive"):
        ConfidentParams(10.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        label_within_budgets(histograms(10), PARAMS, [0.0], 1e-5, SecureRandom(), num_teachers=50)


def test_a_budget_too_small_for_one_query_labels_nothing() -> None:
    (run,) = label_within_budgets(
        histograms(20), PARAMS, [1e-6], 1e-5, SecureRandom(), num_teachers=50
    )
    assert run.processed == 0 and not run.answered.any()


PLAIN = ConfidentParams(threshold=None, sigma1=1.0, sigma2=6.0)


def test_plain_gnmax_by_rdp_charges_the_answers_only() -> None:
    h = histograms()
    (run,) = label_within_budgets(
        h, PLAIN, [3.0], 1e-5, SecureRandom.from_seed("p"), num_teachers=50
    )
    labels = gnmax(h, PLAIN.sigma2, SecureRandom.from_seed("p"))
    assert 0 < run.processed < len(h) and run.accountant == "rdp"
    np.testing.assert_array_equal(run.labels[: run.processed], labels[: run.processed])
    acc = Accountant("central")
    plain_gnmax = MECHANISMS["gnmax"].from_params(10, {"sigma": PLAIN.sigma2})
    for i in range(run.processed):
        acc.compose(plain_gnmax.data_dependent_event(h[i], True, DEFAULT_ORDERS))
    assert run.epsilon == pytest.approx(acc.spent(1e-5).epsilon, rel=1e-9)
    acc.compose(plain_gnmax.data_dependent_event(h[run.processed], True, DEFAULT_ORDERS))
    assert acc.spent(1e-5).epsilon > run.budget


def test_the_gdp_accountant_stops_where_the_exact_bound_says_whatever_the_votes() -> None:
    budgets = [1.0, 3.0]
    stops = set()
    for seed in range(3):
        h = histograms(seed=seed)
        runs = label_within_budgets(
            h,
            PLAIN,
            budgets,
            1e-5,
            SecureRandom.from_seed("g"),
            num_teachers=50,
            accountants=("rdp", "gdp"),
        )
        by_rdp, by_gdp = runs[:2], runs[2:]
        labels = gnmax(h, PLAIN.sigma2, SecureRandom.from_seed("g"))
        for r, g in zip(by_rdp, by_gdp, strict=True):
            assert g.accountant == "gdp" and g.budget == r.budget
            # One draw: the accountants differ only in where they stop.
            np.testing.assert_array_equal(g.labels[: g.processed], labels[: g.processed])
            assert (g.labels[g.processed :] == -1).all()
            per_query = gaussian_dp.gnmax_mu(PLAIN.sigma2)
            assert g.processed == gaussian_dp.max_queries(per_query, g.budget, 1e-5)
            assert g.epsilon <= g.budget == r.budget
            assert g.epsilon == g.sanitised_epsilon  # data-independent: released as it is
            # exact composition answers at least what the data-independent RDP bound allows
            by_rdp_bound = planning.max_queries(
                rdp.gnmax_data_independent(PLAIN.sigma2, DEFAULT_ORDERS),
                DEFAULT_ORDERS,
                g.budget,
                1e-5,
            )
            assert g.processed >= by_rdp_bound
            stops.add((g.budget, g.processed))
    assert len(stops) == len(budgets)  # the same stop for every histogram


def test_the_gdp_accountant_refuses_confident_gnmax_and_unknown_accountants() -> None:
    h = histograms(10)
    with pytest.raises(ValueError, match="plain GNMax only"):
        label_within_budgets(
            h, PARAMS, [1.0], 1e-5, SecureRandom(), num_teachers=50, accountants=("gdp",)
        )
    with pytest.raises(ValueError, match="unknown accountants"):
        label_within_budgets(
            h, PLAIN, [1.0], 1e-5, SecureRandom(), num_teachers=50, accountants=("moments",)
        )
    assert PLAIN.scaled(200, reference=100) == ConfidentParams(None, 2.0, 12.0)
    with pytest.raises(ValueError, match="threshold >= 0"):
        ConfidentParams(-1.0, 1.0, 1.0)
