"""Planning: queries that fit a budget and the noise a plan needs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capc.privacy import events, planning, rdp
from capc.privacy.conversion import DEFAULT_ORDERS, PATE_ORDERS, Conversion
from capc.privacy.mechanisms import upsampling_replicas, weights_for_caps

A = [200, 30, 20, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(("eps", "dd", "di"), [(1, 200, 33), (2, 784, 128), (8, 5853, 1674)])
def test_reference_query_counts(eps: float, dd: int, di: int) -> None:
    basic = Conversion.BASIC
    assert planning.max_queries(rdp.gnmax(A, 40, PATE_ORDERS), PATE_ORDERS, eps, 1e-5, basic) == dd
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
    unit = events.confident_gnmax_unit(150 / 40)
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
    w = weights_for_caps(caps, 1e-5, 40.0, q)
    for cap, wi in zip(caps, w, strict=True):
        per = rdp.weighted_gnmax(float(wi), 40.0, DEFAULT_ORDERS)
        assert planning.epsilon_after(per, DEFAULT_ORDERS, q, 1e-5).epsilon == pytest.approx(
            cap, rel=1e-6
        )


def test_upsampling_replicas_fit_caps() -> None:
    u = upsampling_replicas(np.array([0.5, 2.0, 8.0, 100.0]), 1e-5, 40.0, 200, max_replicas=6)
    assert list(u) == sorted(u) and u[-1] == 6
    for cap, ui in zip([0.5, 2.0, 8.0], u[:3], strict=True):
        if ui > 0:
            per = rdp.upsampled_gnmax(int(ui), 40.0, DEFAULT_ORDERS)
            assert planning.epsilon_after(per, DEFAULT_ORDERS, 200, 1e-5).epsilon <= cap
            per_more = rdp.upsampled_gnmax(int(ui) + 1, 40.0, DEFAULT_ORDERS)
            assert planning.epsilon_after(per_more, DEFAULT_ORDERS, 200, 1e-5).epsilon > cap
