"""Gaussian differential privacy (Dong, Roth and Su 2022): exact accounting of Gaussian noise.

A Gaussian mechanism of L2 sensitivity s and noise sigma is mu-GDP with
mu = s / sigma, a post-processing of it (an argmax) is too, and any adaptive
sequence of mu_i-GDP mechanisms, each chosen before it runs, is
sqrt(sum mu_i**2)-GDP. mu-GDP holds exactly the (epsilon, delta) pairs with
delta >= Phi(mu/2 - epsilon/mu) - e**epsilon Phi(-mu/2 - epsilon/mu), the
hockey-stick divergence between N(0, 1) and N(mu, 1); nothing is lost in a
conversion, so for a composition of Gaussian mechanisms it gives the smallest
epsilon of any accountant. It covers only mechanisms that are Gaussian: plain
GNMax, not the data-dependent analysis of Confident-GNMax.

Units: epsilon in nats; mu is dimensionless (sensitivity over noise scale).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special
from numpy.typing import ArrayLike

from capc.privacy import validation as check

#: Bisection steps: halving a bracket of width 2**10 this often reaches the float64 spacing.
_STEPS = 200


def gaussian_mu(sensitivity: float, sigma: float) -> float:
    """mu of a Gaussian mechanism: L2 ``sensitivity`` over noise standard deviation ``sigma``."""
    return check.non_negative(sensitivity, "sensitivity") / check.positive(sigma, "sigma")


def gnmax_mu(sigma: float) -> float:
    """mu of one GNMax answer at noise ``sigma`` (votes): one teacher moves two counts by one."""
    return gaussian_mu(math.sqrt(2.0), sigma)


def compose_mu(mus: ArrayLike) -> float:
    """mu of the composition of mechanisms that are mu_i-GDP: sqrt(sum mu_i**2)."""
    m = np.atleast_1d(np.asarray(mus, dtype=np.float64))
    if np.isnan(m).any() or (m < 0).any():
        raise ValueError("every mu must be non-negative and not NaN")
    return float(np.sqrt(np.sum(m * m)))


def _mu(value: float) -> float:
    m = float(value)
    if not (math.isfinite(m) and m >= 0):
        raise ValueError(f"mu must be finite and >= 0, got {value!r}")
    return m


def log_delta_at(mu: float, epsilon: float) -> float:
    """log delta(epsilon) of mu-GDP (nats), computed in log space so tiny deltas keep digits."""
    m = _mu(mu)
    eps = check.non_negative(epsilon, "epsilon")
    if m == 0.0:
        return -math.inf
    a = float(scipy.special.log_ndtr(m / 2.0 - eps / m))
    b = float(scipy.special.log_ndtr(-m / 2.0 - eps / m))
    # delta = Phi(a') (1 - exp(eps + log Phi(b') - log Phi(a'))); the ratio is below one.
    ratio = eps + b - a
    if ratio >= 0.0:
        return -math.inf
    return a + math.log(-math.expm1(ratio))


def delta_at(mu: float, epsilon: float) -> float:
    """The smallest delta for which a mu-GDP mechanism is (epsilon, delta)-DP."""
    return math.exp(log_delta_at(mu, epsilon))


#: Relative slack on delta: log_ndtr's cancellation error is far below it, so a pair
#: that passes is (epsilon, delta)-DP whatever the rounding.
_DELTA_SLACK = 1e-9


def within(mu: float, epsilon: float, delta: float) -> bool:
    """True when a mu-GDP mechanism is (epsilon, delta)-DP (epsilon in nats); conservative:
    the computed delta must stay below ``delta`` by a relative margin of 1e-9."""
    # Both forms, so neither the rounding of exp near delta nor an underflow to 0 for a
    # delta below the float range can let an epsilon through that is too small.
    log = log_delta_at(mu, epsilon)
    bound = delta * (1.0 - _DELTA_SLACK)
    return log <= math.log(bound) and math.exp(log) <= bound


def epsilon_at(mu: float, delta: float) -> float:
    """The smallest epsilon (nats) for which a mu-GDP mechanism is (epsilon, delta)-DP.

    Rounded up: the returned epsilon always satisfies delta(mu, epsilon) <= delta.
    """
    m = _mu(mu)
    d = check.delta(delta)
    if within(m, 0.0, d):
        return 0.0
    lo, hi = 0.0, 1.0
    while not within(m, hi, d):
        lo, hi = hi, 2.0 * hi
    for _ in range(_STEPS):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if not within(m, mid, d):
            lo = mid
        else:
            hi = mid
    return hi


def max_mu(epsilon: float, delta: float) -> float:
    """The largest mu whose mechanism is (epsilon, delta)-DP (delta grows with mu).

    Rounded down: the returned mu always satisfies delta(mu, epsilon) <= delta.
    """
    eps = check.positive(epsilon, "epsilon")
    d = check.delta(delta)
    lo, hi = 0.0, 1.0
    while within(hi, eps, d):
        lo, hi = hi, 2.0 * hi
    for _ in range(_STEPS):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if within(mid, eps, d):
            lo = mid
        else:
            hi = mid
    return lo


def max_queries_gdp(
    per_query_mu: float, epsilon: float, delta: float, spent_mu: float = 0.0
) -> int:
    """How many more queries of ``per_query_mu`` fit (epsilon, delta) after ``spent_mu``.

    Exact: n fits iff sqrt(spent_mu**2 + n per_query_mu**2) <= max_mu(epsilon, delta).
    """
    q = _mu(per_query_mu)
    if q == 0.0:
        raise ValueError("per_query_mu must be positive: a free query fits any budget")
    room = max_mu(epsilon, delta) ** 2 - _mu(spent_mu) ** 2
    if room < 0:
        return 0
    n = math.floor(room / (q * q))
    # Guard the float floor on either side.
    while n > 0 and not within(math.sqrt(spent_mu**2 + n * q * q), epsilon, delta):
        n -= 1
    while within(math.sqrt(spent_mu**2 + (n + 1) * q * q), epsilon, delta):
        n += 1
    return n
