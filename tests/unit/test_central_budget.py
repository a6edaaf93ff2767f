"""Central mode's one budget filter: the per-query rule is a query-by-query loop's to the
last bit (the running charge searched, not walked), and the rounds rule is the guardian's."""

from __future__ import annotations

import numpy as np
import pytest

from capc.mechanisms import Mechanism, from_config
from capc.privacy.accountants import Accounting, GaussianDp, RenyiDp
from capc.round.central_budget import Filtered, budget_filter

CONFIDENT = from_config(
    {"name": "confident-gnmax", "sigma": 25.0, "threshold": 150.0, "sigma1": 40.0}, 10
)
GNMAX = from_config({"name": "gnmax", "sigma": 25.0}, 10)


def walked(
    answered: np.ndarray,
    mech: Mechanism,
    budget: float,
    acct: Accounting,
    weight: float = 1.0,
    voting: np.ndarray | None = None,
) -> Filtered:
    """The per-query rule as a loop: each test, then each answer, while it fits."""
    on = np.ones(len(answered), dtype=bool) if voting is None else voting
    declined = (
        acct.filter_cost(mech.event(np.zeros(1, dtype=bool), weight))
        if mech.confident
        else acct.zero()
    )
    answer = acct.filter_cost(mech.event(np.ones(1, dtype=bool), weight)) - declined
    spent = acct.zero()
    for i, (a, v) in enumerate(zip(answered, on, strict=True)):
        after_test = spent + declined * v
        if not acct.fits(after_test, budget, 1e-5):
            return Filtered(i, spent)
        after = after_test + answer * (a and v)
        if not acct.fits(after, budget, 1e-5):
            return Filtered(i, after_test)
        spent = after
    return Filtered(len(answered), spent)


@pytest.mark.parametrize("acct", [RenyiDp(), GaussianDp()], ids=["rdp", "gdp"])
@pytest.mark.parametrize("mech", [CONFIDENT, GNMAX], ids=["confident", "gnmax"])
def test_the_per_query_filter_is_the_loops_to_the_last_bit(
    mech: Mechanism, acct: Accounting
) -> None:
    rng = np.random.default_rng(3)
    stops: set[int] = set()
    # Stops inside the first chunk, past a chunk's end, and never (the pool runs out).
    for n, budget, p in ((3000, 1.0, 0.5), (6000, 20.0, 0.3), (300, 400.0, 0.2)):
        answered = rng.random(n) < p if mech.confident else np.ones(n, dtype=bool)
        voting = rng.random(n) < 0.7
        for weight, on in ((1.0, None), (1.5, voting)):
            got = budget_filter(answered, mech, budget, 1e-5, acct, weight=weight, voting=on)
            want = walked(answered, mech, budget, acct, weight, on)
            assert got.processed == want.processed
            np.testing.assert_array_equal(got.spent, want.spent)
            stops.add(got.processed)
    assert min(stops) < 1024 < max(stops) and 300 in stops


def test_a_stop_after_a_passed_test_is_charged_the_test() -> None:
    acct = GaussianDp()
    answered = np.ones(10_000, dtype=bool)
    run = budget_filter(answered, CONFIDENT, 3.0, 1e-5, acct)
    tests = acct.filter_cost(CONFIDENT.event(np.zeros(1, dtype=bool)))
    answers = acct.filter_cost(CONFIDENT.event(np.ones(1, dtype=bool))) - tests
    charged = run.processed * (tests + answers)
    # Either the next test did not fit, or it did and its answer did not.
    assert run.spent[0] in (pytest.approx(charged[0]), pytest.approx((charged + tests)[0]))
    assert not acct.fits(charged + tests + answers, 3.0, 1e-5)


def test_the_votes_are_not_an_argument_and_neither_are_unanswered_answers() -> None:
    # The same outcomes stop at the same query whatever the pool beyond the stop holds.
    answered = np.random.default_rng(0).random(4000) < 0.4
    run = budget_filter(answered, CONFIDENT, 5.0, 1e-5)
    tail = answered.copy()
    tail[run.processed + 1 :] = ~tail[run.processed + 1 :]
    assert budget_filter(tail, CONFIDENT, 5.0, 1e-5).processed == run.processed


def test_rounds_reserve_their_worst_case_and_charge_what_happened() -> None:
    acct = GaussianDp()
    every = np.ones(50_000, dtype=bool)
    fit = acct.max_count(GNMAX.per_query(), 4.0, 1e-5)
    assert budget_filter(every, GNMAX, 4.0, 1e-5, acct, rounds=256).processed == fit
    robust = from_config(
        {"name": "robust-confident-gnmax", "sigma": 40.0, "threshold": 125.0, "sigma1": 50.0}, 10
    )
    few = np.random.default_rng(1).random(50_000) < 0.2
    worst = budget_filter(every, robust, 4.0, 1e-5, acct, rounds=256)
    some = budget_filter(few, robust, 4.0, 1e-5, acct, rounds=256)
    assert worst.processed < some.processed
    assert acct.fits(some.spent, 4.0, 1e-5)


def test_the_filter_refuses_what_it_cannot_filter() -> None:
    with pytest.raises(ValueError, match="weight 1"):
        budget_filter(np.ones(4, dtype=bool), GNMAX, 1.0, 1e-5, rounds=2, weight=2.0)
    with pytest.raises(ValueError, match="at least one"):
        budget_filter(np.ones(4, dtype=bool), GNMAX, 1.0, 1e-5, rounds=0)
    with pytest.raises(ValueError, match="voting must have shape"):
        budget_filter(np.ones(4, dtype=bool), GNMAX, 1.0, 1e-5, voting=np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match=r"\(N,\)"):
        budget_filter(np.ones((4, 2), dtype=bool), GNMAX, 1.0, 1e-5)


@pytest.mark.parametrize("acct", [RenyiDp(), GaussianDp()], ids=["rdp", "gdp"])
@pytest.mark.parametrize("budget", [float("nan"), float("inf"), -1.0])
def test_a_cap_that_is_no_number_is_refused_by_every_accountant(
    acct: Accounting, budget: float
) -> None:
    # Renyi DP's fits alone let an infinite cap admit everything and a NaN one nothing.
    with pytest.raises(ValueError, match="budget"):
        budget_filter(np.ones(4, dtype=bool), GNMAX, budget, 1e-5, acct)
    with pytest.raises(ValueError, match="delta"):
        budget_filter(np.ones(0, dtype=bool), GNMAX, 1.0, 0.0, acct)


def test_a_cap_met_exactly_admits_the_query_that_meets_it() -> None:
    acct = RenyiDp()
    answered = np.ones(2000, dtype=bool)
    want = walked(answered, GNMAX, 3.0, acct)
    exact = acct.spent(want.spent, 1e-5).epsilon
    # A cap equal to what k queries spend admits those k and no more.
    assert budget_filter(answered, GNMAX, exact, 1e-5, acct).processed == want.processed
    zero = budget_filter(answered, GNMAX, 0.0, 1e-5, acct)
    assert zero.processed == 0 and not zero.spent.any()
