"""RDP to (epsilon, delta): the reference README's whole-run figures and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from capc.privacy import rdp
from capc.privacy.accountant import epsilon
from capc.privacy.conversion import DEFAULT_ORDERS, PATE_ORDERS, Conversion, convert, epsilon_basic

A = [200, 30, 20, 0, 0, 0, 0, 0, 0, 0]
B = [250, 0, 0, 0, 0, 0, 0, 0, 0, 0]


def test_default_grid_is_documented_one() -> None:
    assert DEFAULT_ORDERS[0] == 2.0 and DEFAULT_ORDERS[195] == 99.5
    assert DEFAULT_ORDERS.size == 196 + 200 and DEFAULT_ORDERS[-1] == pytest.approx(1000.0)


def test_basic_conversion_whole_run() -> None:
    eps, order = epsilon_basic(
        1000 * rdp.gnmax_data_dependent(A, 40, PATE_ORDERS), PATE_ORDERS, 1e-5
    )
    assert eps == pytest.approx(2.31115, abs=5e-6) and order == 13.5


def test_improved_conversion_whole_run() -> None:
    eps, order = epsilon(
        1000 * rdp.gnmax_data_dependent(A, 40, DEFAULT_ORDERS), DEFAULT_ORDERS, 1e-5
    )
    assert eps == pytest.approx(2.02177, abs=5e-6) and order == 12.5


def test_confident_gnmax_whole_run() -> None:
    o = PATE_ORDERS
    every = 1000 * (
        rdp.threshold_data_dependent(A, 200, 150, o) + rdp.gnmax_data_dependent(A, 40, o)
    )
    none = 1000 * rdp.threshold_data_dependent(A, 200, 150, o)
    assert epsilon_basic(every, o, 1e-5)[0] == pytest.approx(2.6026, abs=5e-5)
    assert epsilon_basic(none, o, 1e-5)[0] == pytest.approx(1.0339, abs=5e-5)


def test_confident_histogram_b_and_tv_shortcut() -> None:
    o = np.arange(2, 101, dtype=np.float64)
    total = 1000 * rdp.gnmax_data_dependent(B, 20, o)
    assert total[0] == pytest.approx(7.7e-15, rel=0.01)
    eps, order = epsilon(total, o, 1e-5)
    assert eps == pytest.approx(0.137, abs=5e-4) and order == 51
    tv = convert(total, o, 1e-5, tv_shortcut=True)
    assert tv.epsilon == 0.0 and tv.tv_shortcut


@pytest.mark.parametrize(
    ("rdp_value", "orders", "delta", "message"),
    [
        ([0.1], [2.0], 0.0, "delta"),
        ([0.1], [2.0], 1.0, "delta"),
        ([0.1], [1.0], 1e-5, "orders"),
        ([float("nan")], [2.0], 1e-5, "rdp"),
        ([-0.1], [2.0], 1e-5, "rdp"),
        ([0.1, 0.2], [2.0], 1e-5, "shapes"),
    ],
)
def test_bad_input_names_the_value(
    rdp_value: list[float], orders: list[float], delta: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        epsilon(rdp_value, orders, delta)


# A coarse sub-grid keeps the generated curves small enough to shrink well.
GRID = DEFAULT_ORDERS[::20]
curves = st.lists(st.floats(0, 50, allow_nan=False), min_size=GRID.size, max_size=GRID.size)


@given(curves, st.floats(1e-12, 0.5))
def test_improved_never_worse_than_basic(curve: list[float], delta: float) -> None:
    r = np.array(curve)
    assert (
        convert(r, GRID, delta).epsilon <= convert(r, GRID, delta, Conversion.BASIC).epsilon + 1e-12
    )


@given(curves, curves, st.floats(1e-12, 0.5))
def test_composition_is_monotone(a: list[float], b: list[float], delta: float) -> None:
    ra, rb = np.array(a), np.array(b)
    ea = epsilon(ra, GRID, delta)[0]
    eab = epsilon(ra + rb, GRID, delta)[0]
    assert eab >= ea - 1e-12
    assert math.isfinite(eab)


@given(st.floats(0.5, 1e4), st.integers(1, 10_000), st.floats(1e-10, 0.1))
def test_gaussian_epsilon_shrinks_with_noise(sigma: float, n: int, delta: float) -> None:
    small = epsilon(n * rdp.gnmax_data_independent(sigma, DEFAULT_ORDERS), DEFAULT_ORDERS, delta)[0]
    large = epsilon(
        n * rdp.gnmax_data_independent(2 * sigma, DEFAULT_ORDERS), DEFAULT_ORDERS, delta
    )[0]
    assert large <= small
