"""The Gaussian-DP accountant: exact, never below what a mechanism really leaks, never looser
than RDP, and in agreement with dp-accounting's privacy-loss-distribution accountant."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import scipy.integrate
import scipy.stats
from dp_accounting.pld import pld_privacy_accountant

from capc.privacy import gaussian_dp, planning, rdp
from capc.privacy.conversion import DEFAULT_ORDERS, convert


def _hockey_stick(mu: float, epsilon: float) -> float:
    """sup over events of P(E) - e**eps Q(E) for P = N(mu, 1), Q = N(0, 1), by quadrature."""

    def integrand(x: float) -> float:
        gap = scipy.stats.norm.pdf(x, mu) - math.exp(epsilon) * scipy.stats.norm.pdf(x)
        return max(0.0, float(gap))

    # The integrand is positive only right of the point where the densities cross.
    cross = epsilon / mu + mu / 2.0
    value, _ = scipy.integrate.quad(integrand, cross, cross + 40.0, epsabs=1e-14, epsrel=1e-10)
    return float(value)


@pytest.mark.parametrize(("mu", "epsilon"), [(0.5, 0.1), (1.0, 1.0), (2.0, 3.0), (3.0, 10.0)])
def test_delta_is_the_hockey_stick_divergence_of_two_gaussians(mu: float, epsilon: float) -> None:
    assert gaussian_dp.delta_at(mu, epsilon) == pytest.approx(_hockey_stick(mu, epsilon), rel=1e-6)


def test_known_values_and_edges() -> None:
    # At epsilon 0 delta is the total variation distance 2 Phi(mu / 2) - 1.
    assert gaussian_dp.delta_at(1.0, 0.0) == pytest.approx(2 * scipy.stats.norm.cdf(0.5) - 1)
    assert gaussian_dp.delta_at(0.0, 1.0) == 0.0
    assert gaussian_dp.epsilon_at(0.0, 1e-5) == 0.0
    # Far in the tail delta underflows a float, its logarithm does not, and still falls.
    far = gaussian_dp.log_delta_at(0.5, 20.0)
    assert math.isfinite(far) and far < -745 and far < gaussian_dp.log_delta_at(0.5, 19.0)
    assert gaussian_dp.compose_mu([0.3, 0.4]) == pytest.approx(0.5)
    assert gaussian_dp.gnmax_mu(40.0) == pytest.approx(math.sqrt(2) / 40)


@pytest.mark.parametrize(("mu", "delta"), [(0.05, 1e-5), (0.7, 1e-6), (2.0, 1e-5), (6.0, 1e-3)])
def test_epsilon_is_rounded_up_and_max_mu_down(mu: float, delta: float) -> None:
    eps = gaussian_dp.epsilon_at(mu, delta)
    assert gaussian_dp.delta_at(mu, eps) <= delta
    assert gaussian_dp.delta_at(mu, eps * (1 - 1e-9)) > delta
    top = gaussian_dp.max_mu(eps, delta)
    assert gaussian_dp.delta_at(top, eps) <= delta
    assert gaussian_dp.delta_at(top * (1 + 1e-9), eps) > delta
    assert top == pytest.approx(mu, rel=1e-8)


@pytest.mark.parametrize(
    ("sigma", "count", "delta"), [(40.0, 3201, 1e-5), (16.0, 500, 1e-5), (4.0, 50, 1e-6)]
)
def test_composition_agrees_with_the_pld_accountant(sigma: float, count: int, delta: float) -> None:
    theirs = pld_privacy_accountant.PLDAccountant()
    theirs.compose(dp_accounting.GaussianDpEvent(sigma / math.sqrt(2)), count)
    mine = gaussian_dp.epsilon_at(math.sqrt(count) * gaussian_dp.gnmax_mu(sigma), delta)
    # The PLD accountant discretises the loss pessimistically: never below the exact value.
    assert mine <= theirs.get_epsilon(delta) + 1e-9
    assert mine == pytest.approx(theirs.get_epsilon(delta), abs=1e-3)


@pytest.mark.parametrize("sigma", [2.0, 16.0, 40.0, 150.0])
@pytest.mark.parametrize("budget", [1.0, 5.0, 10.0, 20.0])
def test_never_looser_than_rdp_and_the_query_count_is_exact(sigma: float, budget: float) -> None:
    per_query = gaussian_dp.gnmax_mu(sigma)
    n = gaussian_dp.max_queries_gdp(per_query, budget, 1e-5)
    by_rdp = planning.max_queries(
        rdp.gnmax_data_independent(sigma, DEFAULT_ORDERS), DEFAULT_ORDERS, budget, 1e-5
    )
    assert n >= by_rdp
    if n:
        assert gaussian_dp.epsilon_at(math.sqrt(n) * per_query, 1e-5) <= budget
        rdp_eps = convert(
            n * rdp.gnmax_data_independent(sigma, DEFAULT_ORDERS), DEFAULT_ORDERS, 1e-5
        )
        assert gaussian_dp.epsilon_at(math.sqrt(n) * per_query, 1e-5) <= rdp_eps.epsilon
    assert gaussian_dp.epsilon_at(math.sqrt(n + 1) * per_query, 1e-5) > budget


def test_the_250_teacher_budget() -> None:
    # sigma2 = 40 votes at eps 10, delta 1e-5: 2849 queries by RDP (docs/diet.md), 3201 exactly.
    assert gaussian_dp.max_queries_gdp(gaussian_dp.gnmax_mu(40.0), 10.0, 1e-5) == 3201
    spent = math.sqrt(1000) * gaussian_dp.gnmax_mu(40.0)
    assert (
        gaussian_dp.max_queries_gdp(gaussian_dp.gnmax_mu(40.0), 10.0, 1e-5, spent_mu=spent) == 2201
    )


def test_a_vote_moving_between_two_classes_leaks_as_much_as_the_bound_says() -> None:
    # Two classes: GNMax answers class 0 iff the noise difference N(0, 2 sigma**2) stays
    # below the vote gap g, and one teacher moving from class 0 to 1 turns g into g - 2.
    # Over all gaps, the output's hockey-stick divergence must stay within the bound at
    # mu = sqrt(2) / sigma and come close to it (the bound is tight for this worst case);
    # a bound at sensitivity 1 (mu = 1 / sigma) would be exceeded.
    sigma, spread = 4.0, math.sqrt(2) * 4.0
    gaps = np.arange(-60.0, 61.0, 0.25)
    p0 = scipy.stats.norm.cdf(gaps / spread)
    q0 = scipy.stats.norm.cdf((gaps - 2.0) / spread)
    for eps in (0.0, 0.05, 0.2, 0.5):
        worst = 0.0
        for p, q in ((p0, q0), (q0, p0)):
            leak = np.maximum(0, p - math.exp(eps) * q) + np.maximum(
                0, (1 - p) - math.exp(eps) * (1 - q)
            )
            worst = max(worst, float(leak.max()))
        bound = gaussian_dp.delta_at(gaussian_dp.gnmax_mu(sigma), eps)
        assert worst <= bound * (1 + 1e-9)
        assert worst >= 0.99 * bound
        assert worst > gaussian_dp.delta_at(1.0 / sigma, eps)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: gaussian_dp.delta_at(float("nan"), 1.0), "mu"),
        (lambda: gaussian_dp.delta_at(-1.0, 1.0), "mu"),
        (lambda: gaussian_dp.delta_at(1.0, -1.0), "epsilon"),
        (lambda: gaussian_dp.epsilon_at(1.0, 0.0), "delta"),
        (lambda: gaussian_dp.epsilon_at(1.0, 1.5), "delta"),
        (lambda: gaussian_dp.max_mu(0.0, 1e-5), "epsilon"),
        (lambda: gaussian_dp.max_queries_gdp(0.0, 1.0, 1e-5), "per_query_mu"),
        (lambda: gaussian_dp.gaussian_mu(1.0, 0.0), "sigma"),
        (lambda: gaussian_dp.compose_mu([0.1, float("nan")]), "mu"),
    ],
)
def test_bad_input_is_refused(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]
