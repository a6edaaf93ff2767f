"""The threshold test's data-dependent bound against exact Renyi divergences.

The released bit is Bern(p(m)), p(m) = Pr[m + N(0, sigma1**2) >= T]; a
neighbour moves the max vote m by one. Every bound here must be at least
D_alpha(Bern(p(m)) || Bern(p(m'))) for m' = m - 1 and m + 1, computed with
mpmath at 50 digits from both Gaussian tails, so no gap is too extreme: the
float64 code once charged 0 once p rounded to 1 ((m - T) / sigma1 above ~37).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from capc.privacy import rdp

ORDERS = np.arange(2, 101, dtype=np.float64)
MP = mpmath.mp.clone()
MP.dps = 50


def log_phi(z: float) -> mpmath.mpf:
    """log Pr[N(0, 1) <= z] at 50 digits: through the other tail when z > 0, so 1 - tiny keeps its digits."""
    x = MP.mpf(z)
    if x > 0:
        return MP.log1p(-MP.ncdf(-x))
    return MP.log(MP.ncdf(x))


def exact(threshold: float, sigma1: float, m: float, m2: float) -> np.ndarray:
    """D_alpha(Bern(p(m)) || Bern(p(m2))) at every order of ORDERS, in nats."""
    lp, l1p = log_phi((m - threshold) / sigma1), log_phi((threshold - m) / sigma1)
    lq, l1q = log_phi((m2 - threshold) / sigma1), log_phi((threshold - m2) / sigma1)
    out = []
    for order in ORDERS:
        a = MP.mpf(float(order))
        log_sum = MP.log(MP.exp(a * lp + (1 - a) * lq) + MP.exp(a * l1p + (1 - a) * l1q))
        out.append(float(log_sum / (a - 1)))
    return np.array(out)


def worst_shortfall(threshold: float, sigma1: float, m: float) -> float:
    """max over orders and neighbours of exact - bound; <= 0 when the bound holds."""
    bound = rdp.threshold_data_dependent(np.array([m, 0.0]), threshold, sigma1, ORDERS)
    worst = -math.inf
    for m2 in (m - 1.0, m + 1.0):
        if m2 < 0:
            continue
        measured = exact(threshold, sigma1, m, m2)
        # 1e-12 relative: the exact value's own rounding to float64, nothing more.
        worst = max(worst, float(np.max(measured - bound * (1 + 1e-12))))
    return worst


@pytest.mark.parametrize(
    ("threshold", "sigma1", "maxima"),
    [
        # (m - T) / sigma1 runs over every integer from -60 to 60.
        (60.0, 1.0, range(0, 121)),
        # Steps of 1.2 in (m - T) / sigma1 from -60 to 60, threshold between integers.
        (150.5, 2.5, range(1, 302, 3)),
        # Smaller noise: gaps from -60 to 60 in steps of 1.25 sigma1.
        (36.0, 0.6, range(0, 73, 1)),
    ],
)
def test_threshold_bound_is_never_below_the_exact_divergence(
    threshold: float, sigma1: float, maxima: range
) -> None:
    bad = [(m, gap) for m in maxima if (gap := worst_shortfall(threshold, sigma1, float(m))) > 0.0]
    assert not bad, f"bound below the exact divergence at (max, shortfall): {bad[:5]}"


def test_huge_gap_is_charged_what_it_leaks() -> None:
    # T = 0, sigma1 = 1, max = 60: Pr[answered] rounds to 1 in float64, yet the
    # neighbour with max 61 is told apart at high orders: about 23.7 nats at order 50.
    votes = np.array([60.0, 0.0])
    at_50 = ORDERS == 50
    measured = exact(0.0, 1.0, 60.0, 61.0)[at_50][0]
    bound = rdp.threshold_data_dependent(votes, 0.0, 1.0, ORDERS)[at_50][0]
    assert 23.5 < measured < 23.8
    assert measured <= bound <= rdp.threshold_data_independent(1.0, [50.0])[0]


def test_both_tails_keep_their_digits() -> None:
    votes = np.array([60.0, 3.0])
    assert rdp.log_pr_not_answered(votes, 0.0, 1.0) == pytest.approx(
        float(log_phi(-60.0)), rel=1e-12
    )
    assert rdp.log_pr_answered(votes, 120.0, 1.0) == pytest.approx(float(log_phi(-60.0)), rel=1e-12)
    # log p of a near-certain answer: -Pr[not answered], not 0.
    assert rdp.log_pr_answered(votes, 20.0, 1.0) == pytest.approx(-float(MP.ncdf(-40.0)), rel=1e-9)


@pytest.mark.parametrize(
    ("threshold", "sigma1", "top"),
    [(70.0, 1.0, 59.4), (10.0, 1.5, 4.4), (10.0, 1.5, 15.6), (30.0, 2.0, 20.45)],
)
def test_non_integer_max_is_charged_on_the_safe_side(
    threshold: float, sigma1: float, top: float
) -> None:
    # Rounding 59.4 down to 59 moves it away from T = 70 and under-charged by 0.12 at order 7.
    assert worst_shortfall(threshold, sigma1, top) <= 0.0
    bound = rdp.threshold_data_dependent(np.array([top, 0.0]), threshold, sigma1, ORDERS)
    for rounded in (math.floor(top), math.ceil(top)):
        at_integer = rdp.threshold_data_dependent(
            np.array([float(rounded), 0.0]), threshold, sigma1, ORDERS
        )
        assert np.all(bound >= at_integer)


def test_integer_max_is_used_as_it_is() -> None:
    assert rdp.tested_max([40.0, 2.0], 100.0) == 40.0
    assert rdp.tested_max([40.4, 2.0], 100.0) == 41.0
    assert rdp.tested_max([40.4, 2.0], 3.0) == 40.0
    assert rdp.tested_max([40.4, 2.0], 40.2) == 40.2
