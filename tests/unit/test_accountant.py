"""Accountant: composition, budget checks before spending, save/restore, reports."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capc.privacy import events, rdp
from capc.privacy.accountant import Accountant, Budget, BudgetExceededError, epsilon
from capc.privacy.accountants import UnsupportedEventError
from capc.privacy.conversion import DEFAULT_ORDERS

A = [200, 30, 20, 0, 0, 0, 0, 0, 0, 0]


def gnmax(sigma: float) -> events.GaussianEvent:
    """One answered GNMax query, data-independent: a vote change moves two counts by one."""
    return events.GaussianEvent(math.sqrt(2.0), sigma)


def threshold_test(sigma1: float) -> events.GaussianEvent:
    """One Confident-GNMax threshold test, data-independent: max(votes) moves by one."""
    return events.GaussianEvent(1.0, sigma1)


def test_compose_matches_direct_sum() -> None:
    acc = Accountant("h1")
    acc.compose(threshold_test(150), 10)
    acc.compose(gnmax(40), 4)
    expected = 10 * rdp.threshold_data_independent(
        150, DEFAULT_ORDERS
    ) + 4 * rdp.gnmax_data_independent(40, DEFAULT_ORDERS)
    np.testing.assert_allclose(acc.total, expected)
    assert acc.spent(1e-5).epsilon == pytest.approx(epsilon(expected, DEFAULT_ORDERS, 1e-5)[0])


def test_budget_is_checked_before_anything_is_spent() -> None:
    acc = Accountant("h1")
    budget = Budget(1.0, 1e-5)
    ev = gnmax(10.0)
    assert acc.would_exceed(ev, budget, count=10)
    before = acc.total
    with pytest.raises(BudgetExceededError, match="exceed the budget"):
        acc.compose(ev, 10, budget=budget)
    np.testing.assert_array_equal(acc.total, before)
    assert acc.history == []
    acc.compose(ev, 1, budget=budget)
    assert acc.spent(1e-5).epsilon <= 1.0


def test_remaining_never_negative() -> None:
    acc = Accountant()
    acc.compose(gnmax(1.0), 100)
    assert acc.remaining(Budget(1.0, 1e-5)) == 0.0


def test_state_dict_round_trip_through_json() -> None:
    acc = Accountant("hospital-b")
    o = DEFAULT_ORDERS
    acc.compose(
        events.RdpCurveEvent(
            rdp.threshold_data_dependent(A, 200, 150, o), o, "threshold", data_dependent=True
        ),
        3,
        label="threshold",
    )
    acc.compose(
        events.RdpCurveEvent(rdp.gnmax_data_dependent(A, 40, o), o, "gnmax", data_dependent=True),
        2,
        label="gnmax",
    )
    acc.compose(events.GaussianEvent(math.sqrt(5), 20.0), label="binary-voting")
    state = json.loads(json.dumps(acc.state_dict()))
    restored = Accountant.from_state_dict(state)
    np.testing.assert_array_equal(restored.total, acc.total)
    assert restored.owner == "hospital-b"
    assert [c for _, c in restored.history] == [3, 2, 1]
    assert [e for e, _ in restored.history] == [e for e, _ in acc.history]
    assert restored.report(1e-5).to_dict() == acc.report(1e-5).to_dict()
    assert restored.report(1e-5).data_dependent


def test_identical_events_merge_in_history() -> None:
    acc = Accountant()
    for _ in range(5):
        acc.compose(gnmax(40))
    assert len(acc.history) == 1 and acc.history[0][1] == 5


def test_report_shares_and_method() -> None:
    acc = Accountant("h")
    acc.compose(threshold_test(150), 100, label="threshold")
    acc.compose(gnmax(40), 50, label="gnmax")
    rep = acc.report(1e-5, Budget(5.0, 1e-5))
    assert sum(rep.shares.values()) == pytest.approx(1.0)
    assert set(rep.shares) == {"threshold", "gnmax"}
    assert rep.accountant == "rdp" and rep.order is not None and not rep.data_dependent
    assert rep.remaining == pytest.approx(5.0 - rep.epsilon)
    text = rep.to_text()
    assert "rdp accountant" in text and "Renyi order" in text and "gnmax" in text


def test_mismatched_order_grid_is_rejected() -> None:
    acc = Accountant()
    grid = np.array([2.0, 3.0])
    curve = events.RdpCurveEvent(rdp.gnmax_data_independent(40, grid), grid)
    with pytest.raises(UnsupportedEventError, match="order grid"):
        acc.compose(curve)
    assert acc.history == [] and not acc.total.any()


@pytest.mark.parametrize("count", [-1, 1.5, True])
def test_bad_counts(count: object) -> None:
    with pytest.raises(ValueError, match="count"):
        Accountant().compose(gnmax(40), count)  # type: ignore[arg-type]


def test_bad_state_is_rejected() -> None:
    with pytest.raises(ValueError, match="version"):
        Accountant.from_state_dict({"version": 99})
    state = Accountant().state_dict()
    state["history"] = [{"event": gnmax(40).to_dict(), "count": -2}]
    with pytest.raises(ValueError, match="count"):
        Accountant.from_state_dict(state)


@pytest.mark.parametrize(
    ("bad", "message"), [(float("nan"), "epsilon"), (-1.0, "epsilon"), (0.0, "epsilon")]
)
def test_budget_validation(bad: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Budget(bad, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        Budget(1.0, 2.0)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.5, 1e4), st.integers(0, 500)), min_size=1, max_size=6),
    st.floats(1e-9, 1e-2),
)
def test_composition_order_does_not_matter(plan: list[tuple[float, int]], delta: float) -> None:
    forward, backward = Accountant(), Accountant()
    for sigma, n in plan:
        forward.compose(gnmax(sigma), n)
    for sigma, n in reversed(plan):
        backward.compose(gnmax(sigma), n)
    np.testing.assert_allclose(forward.total, backward.total, rtol=1e-12)
    eps = forward.spent(delta).epsilon
    assert eps == pytest.approx(backward.spent(delta).epsilon, rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.5, 1e4), st.integers(1, 1000), st.integers(1, 1000))
def test_spending_grows_with_queries(sigma: float, a: int, b: int) -> None:
    acc = Accountant()
    acc.compose(gnmax(sigma), a)
    first = acc.spent(1e-5).epsilon
    acc.compose(gnmax(sigma), b)
    assert acc.spent(1e-5).epsilon >= first
