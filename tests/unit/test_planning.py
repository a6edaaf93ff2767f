"""Planning: queries that fit a budget and the noise a plan needs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capc.mechanisms import MECHANISMS, Personalization, from_config
from capc.privacy import events, planning, rdp
from capc.privacy.accountants import RenyiDp
from capc.privacy.conversion import DEFAULT_ORDERS, PATE_ORDERS, Conversion

A = [200, 30, 20, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(("eps", "dd", "di"), [(1, 200, 33), (2, 784, 128), (8, 5853, 1674)])
def test_reference_query_counts(eps: float, dd: int, di: int) -> None:
    basic = Conversion.BASIC
    assert (
        planning.max_queries(
            rdp.gnmax_data_dependent(A, 40, PATE_ORDERS), PATE_ORDERS, eps, 1e-5, basic
        )
        == dd
    )
    assert (
        planning.max_queries(
            rdp.gnmax_data_independent(40, PATE_ORDERS), PATE_ORDERS, eps, 1e-5, basic
        )
        == di
    )


@settings(max_examples=50, deadline=None)
@given(st.floats(1.0, 500.0), st.floats(0.1, 20.0), st.sampled_from([1e-5, 1e-6, 1e-3]))
def test_max_queries_is_exactly_the_boundary(sigma: float, eps: float, delta: float) -> None:
    r = rdp.gnmax_data_independent(sigma, DEFAULT_ORDERS)
    n = planning.max_queries(r, DEFAULT_ORDERS, eps, delta)
    if n > 0:
        assert planning.epsilon_after(r, DEFAULT_ORDERS, n, delta).epsilon <= eps
    assert planning.epsilon_after(r, DEFAULT_ORDERS, n + 1, delta).epsilon > eps


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 100_000), st.floats(0.5, 20.0))
def test_noise_scale_round_trip(queries: int, eps: float) -> None:
    unit = rdp.gnmax_data_independent(1.0, DEFAULT_ORDERS)
    s = planning.noise_scale_for(unit, DEFAULT_ORDERS, queries, eps, 1e-5)
    fits = planning.max_queries(
        rdp.gnmax_data_independent(s * (1 + 1e-9), DEFAULT_ORDERS), DEFAULT_ORDERS, eps, 1e-5
    )
    assert fits >= queries
    assert (
        planning.max_queries(
            rdp.gnmax_data_independent(s * 0.99, DEFAULT_ORDERS), DEFAULT_ORDERS, eps, 1e-5
        )
        < queries
    )


def test_confident_noise_keeps_the_ratio() -> None:
    # One answered Confident-GNMax query at sigma = 1, sigma1 = 150 / 40: both parts scale as
    # 1 / sigma**2 when the ratio is held, which is what noise_scale_for needs.
    mech = MECHANISMS["confident-gnmax"].from_params(
        10, {"sigma": 1.0, "threshold": 0.0, "sigma1": 150 / 40}
    )
    unit = events.rdp_curve(mech.per_query(), DEFAULT_ORDERS)
    s = planning.noise_scale_for(unit, DEFAULT_ORDERS, 2000, 6.0, 1e-5)
    per = rdp.threshold_data_independent(s * 150 / 40, DEFAULT_ORDERS) + rdp.gnmax_data_independent(
        s, DEFAULT_ORDERS
    )
    assert planning.epsilon_after(per, DEFAULT_ORDERS, 2000, 1e-5).epsilon == pytest.approx(
        6.0, rel=1e-6
    )


def test_impossible_targets() -> None:
    r = rdp.gnmax_data_independent(1.0, DEFAULT_ORDERS)
    assert planning.max_queries(r, DEFAULT_ORDERS, 0.01, 1e-10) == 0
    with pytest.raises(ValueError, match="raise epsilon or delta"):
        planning.noise_scale_for(r, DEFAULT_ORDERS, 10, 0.001, 1e-10)
    assert (
        planning.max_queries(np.zeros_like(DEFAULT_ORDERS), DEFAULT_ORDERS, 1.0, 1e-5)
        == planning.UNLIMITED
    )


def test_weights_exhaust_every_cap_together() -> None:
    caps = np.array([np.log(2), np.log(4), np.log(8)])
    q = 500
    gnmax = from_config({"name": "gnmax", "sigma": 40.0}, 10)
    plan = Personalization(mode="weighting", planned_queries=q)
    # Unnormalised: the weight at which each cap is exactly spent after q queries.
    w = np.sqrt(plan.multipliers(caps.tolist(), gnmax, RenyiDp(), 1e-5))
    for cap, wi in zip(caps, w, strict=True):
        per = rdp.weighted_gnmax(float(wi), 40.0, DEFAULT_ORDERS)
        assert planning.epsilon_after(per, DEFAULT_ORDERS, q, 1e-5).epsilon == pytest.approx(
            cap, rel=1e-6
        )


def test_max_queries_counts_what_is_left_after_spending() -> None:
    per = rdp.gnmax_data_independent(30.0, DEFAULT_ORDERS)
    fresh = planning.max_queries(per, DEFAULT_ORDERS, 4.0, 1e-5)
    left = planning.max_queries(per, DEFAULT_ORDERS, 4.0, 1e-5, spent_rdp=100 * per)
    assert left == fresh - 100
    assert planning.max_queries(per, DEFAULT_ORDERS, 4.0, 1e-5, spent_rdp=fresh * per) == 0


def test_cap_derived_weights_and_rates_exhaust_every_cap_together() -> None:
    """Any mechanism's unit (here Binary voting over 5 labels): w**2 or p times it fits each cap
    after the same number of queries; weights average 1, the largest rate is 1."""
    caps = np.array([np.log(2), np.log(2), np.log(8), np.log(8)])
    unit = rdp.multilabel_binary(5, 20.0, DEFAULT_ORDERS)
    binary = from_config({"name": "binary", "sigma": 20.0}, 5)
    acct = RenyiDp()

    def plan(mode: str, max_weight: float = 64.0) -> Personalization:
        return Personalization.model_validate(
            {"mode": mode, "planned_queries": 400, "max_weight": max_weight}
        )

    w = plan("weighting").weights(caps.tolist(), binary, acct, 1e-5, frac_bits=24)
    p = plan("vanishing").rates(caps.tolist(), binary, acct, 1e-5)
    assert w.mean() == pytest.approx(1.0) and w[0] < 1.0 < w[2]
    assert p.max() == 1.0 and 0 < p[0] < p[2]
    q_weighted = [
        planning.max_queries(wi**2 * unit, DEFAULT_ORDERS, c, 1e-5)
        for wi, c in zip(w, caps, strict=True)
    ]
    q_vanishing = [
        planning.max_queries(pi * unit, DEFAULT_ORDERS, c, 1e-5)
        for pi, c in zip(p, caps, strict=True)
    ]
    assert max(q_weighted) - min(q_weighted) <= 0.01 * min(q_weighted)
    assert max(q_vanishing) - min(q_vanishing) <= 0.01 * min(q_vanishing)
    # Against everyone at the smallest cap with weight 1, the low-cap parties last longer.
    baseline = planning.max_queries(unit, DEFAULT_ORDERS, float(caps.min()), 1e-5)
    assert min(q_weighted) > 1.5 * baseline
    capped = plan("weighting", max_weight=1.2).weights(
        caps.tolist(), binary, acct, 1e-5, frac_bits=24
    )
    assert (capped <= 1.2).all() and capped.max() > 1.19
