"""Every claimed data-independent bound against the real divergence of the mechanism.

For worst-case neighbouring histograms (one teacher's vote moved, or one
point's u replicas, or a weighted vote), the Renyi divergence between the
output distributions is computed exactly (quadrature for noisy argmax, closed
form for released bits) or estimated by Monte Carlo with a confidence bound,
and must not exceed what ``capc.privacy.rdp`` charges. Tests marked "teeth"
show that a plausible wrong charge would be caught.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from capc.mechanisms import from_config
from capc.privacy import rdp
from capc.privacy.randomness import SecureRandom
from tests.unit.divergence import (
    argmax_probabilities,
    bernoulli_renyi,
    renyi,
    thresholded_gaussian_worst,
)

ORDERS = np.array([2.0, 4.0, 8.0, 16.0, 32.0])


def _neighbours(hist: np.ndarray, amount: float) -> list[np.ndarray]:
    """All histograms with ``amount`` votes moved from one class to another."""
    out = []
    for i, j in itertools.permutations(range(hist.size), 2):
        if hist[i] >= amount:
            h = hist.copy()
            h[i] -= amount
            h[j] += amount
            out.append(h)
    return out


def _max_argmax_divergence(
    hists: list[np.ndarray], amount: float, noise: str, scale: float
) -> np.ndarray:
    worst = np.zeros_like(ORDERS)
    for h in hists:
        p = argmax_probabilities(h, noise, scale)
        for h2 in _neighbours(h, amount):
            q = argmax_probabilities(h2, noise, scale)
            d = np.array([max(renyi(p, q, a), renyi(q, p, a)) for a in ORDERS])
            worst = np.maximum(worst, d)
    return worst


HISTS = [
    np.array([1.0, 0.0]),
    np.array([3.0, 2.0, 0.0]),
    np.array([2.0, 2.0, 1.0]),
    np.array([5.0, 0.0, 0.0, 0.0]),
]


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0])
def test_gnmax_bound(sigma: float) -> None:
    measured = _max_argmax_divergence(HISTS, 1.0, "gaussian", sigma)
    assert np.all(measured <= rdp.gnmax_data_independent(sigma, ORDERS) * (1 + 1e-6))
    assert measured.max() > 0.1 * rdp.gnmax_data_independent(sigma, ORDERS).min()


def test_powerset_bound() -> None:
    # Powerset voting is GNMax over 2**k subsets: k = 2 gives four classes.
    sigma = 0.7
    hists = [np.array([2.0, 1.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0, 0.0])]
    measured = _max_argmax_divergence(hists, 1.0, "gaussian", sigma)
    assert np.all(measured <= rdp.multilabel_powerset(sigma, ORDERS) * (1 + 1e-6))


@pytest.mark.parametrize("weight", [0.5, 2.0])
def test_weighted_gnmax_bound(weight: float) -> None:
    sigma = 1.0
    hists = [np.array([weight, 0.0]), np.array([3.0 * weight, 2.0, 0.0])]
    measured = _max_argmax_divergence(hists, weight, "gaussian", sigma)
    assert np.all(measured <= rdp.weighted_gnmax(weight, sigma, ORDERS) * (1 + 1e-6))


def test_weighted_gnmax_teeth() -> None:
    # Charging a weight-2 teacher like an unweighted one would under-count.
    sigma = 1.0
    measured = _max_argmax_divergence([np.array([2.0, 0.0])], 2.0, "gaussian", sigma)
    assert (measured > rdp.gnmax_data_independent(sigma, ORDERS)).any()


def test_upsampled_gnmax_bound() -> None:
    sigma, u = 1.0, 3
    measured = _max_argmax_divergence(
        [np.array([3.0, 0.0]), np.array([4.0, 3.0, 0.0])], float(u), "gaussian", sigma
    )
    assert np.all(measured <= rdp.upsampled_gnmax(u, sigma, ORDERS) * (1 + 1e-6))
    assert (measured > rdp.gnmax_data_independent(sigma, ORDERS)).any()


@pytest.mark.parametrize("scale", [0.5, 1.0, 4.0])
def test_laplace_noisy_max_bound(scale: float) -> None:
    measured = _max_argmax_divergence(HISTS[:3], 1.0, "laplace", scale)
    assert np.all(measured <= rdp.laplace_noisy_max_rdp(scale, ORDERS) * (1 + 1e-6))


@pytest.mark.parametrize("sigma1", [0.5, 1.0, 3.0])
def test_threshold_test_bound(sigma1: float) -> None:
    # The released bit is [max + eta1 >= T]; a neighbour moves max by one.
    measured = np.array([thresholded_gaussian_worst(1.0, sigma1, a) for a in ORDERS])
    assert np.all(measured <= rdp.threshold_data_independent(sigma1, ORDERS) * (1 + 1e-6))


@pytest.mark.parametrize("factor", [0.5, 2.0, 3.0])
def test_weighted_and_upsampled_threshold_bounds(factor: float) -> None:
    # A weight-w teacher, or u replicas of one point, move max(votes) by w (or u).
    sigma1 = 1.0
    measured = np.array([thresholded_gaussian_worst(factor, sigma1, a) for a in ORDERS])
    assert np.all(measured <= rdp.weighted_threshold(factor, sigma1, ORDERS) * (1 + 1e-6))
    if factor.is_integer():
        assert np.all(measured <= rdp.upsampled_threshold(int(factor), sigma1, ORDERS) * (1 + 1e-6))
    if factor > 1:
        # Charging it like an unweighted teacher would under-count.
        assert (measured > rdp.threshold_data_independent(sigma1, ORDERS)).any()


@pytest.mark.parametrize("k", [1, 4, 12])
def test_binary_voting_bound(k: int) -> None:
    # k independent bits, each [count_j + eta >= n/2]; one teacher moves every count by one.
    sigma = 1.0
    measured = np.array([k * thresholded_gaussian_worst(1.0, sigma, a) for a in ORDERS])
    assert np.all(measured <= rdp.multilabel_binary(k, sigma, ORDERS) * (1 + 1e-6))


def test_binary_voting_teeth() -> None:
    # Public multi-label code has charged the single-label GNMax bound for k labels.
    sigma, k, order = 1.0, 8, 10.0
    n_teachers, count = 20, 5  # the positive count sits 5 sigma below the majority line
    p = scipy.stats.norm.sf(n_teachers / 2 - count, scale=sigma)
    q = scipy.stats.norm.sf(n_teachers / 2 - count - 1, scale=sigma)
    measured = k * float(bernoulli_renyi(q, p, order))
    assert measured <= rdp.multilabel_binary(k, sigma, [order])[0]
    assert measured > rdp.gnmax_data_independent(sigma, [order])[0]


def _khot(k: int) -> np.ndarray:
    return np.array(list(itertools.product([0.0, 1.0], repeat=k)))


@pytest.mark.parametrize(("k", "tau"), [(4, 1.0), (4, 1.5), (6, 0.8), (3, 5.0)])
def test_tau_voting_bound(k: int, tau: float) -> None:
    # Per label the decision bit moves with the clipped-count change delta_j;
    # the worst threshold is taken for each label separately (an upper bound).
    sigma = 1.0
    votes = from_config({"name": "tau", "sigma": 1.0, "tau": tau}, k).unit_votes(_khot(k))
    claim = rdp.multilabel_tau(k, tau, sigma, ORDERS)
    per_shift: dict[float, np.ndarray] = {}
    for a, b in itertools.combinations(range(votes.shape[0]), 2):
        total = np.zeros_like(ORDERS)
        for delta in np.abs(votes[a] - votes[b]):
            if delta == 0:
                continue
            key = round(float(delta), 12)
            if key not in per_shift:
                per_shift[key] = np.array(
                    [thresholded_gaussian_worst(key, sigma, o) for o in ORDERS]
                )
            total += per_shift[key]
        assert np.all(total <= claim * (1 + 1e-6)), (a, b)


def test_tau_sensitivity_teeth() -> None:
    # tau alone (forgetting the sqrt(2)) under-counts: votes e_1 and e_2 differ by sqrt(2).
    k, tau = 4, 1.0
    votes = from_config({"name": "tau", "sigma": 1.0, "tau": tau}, k).unit_votes(np.eye(k)[:2])
    assert np.linalg.norm(votes[0] - votes[1]) == pytest.approx(rdp.tau_sensitivity(k, tau))
    assert rdp.tau_sensitivity(k, tau) > tau


def test_gnmax_monte_carlo_with_confidence_bound() -> None:
    # Five classes: estimate both output distributions by sampling the real
    # mechanism, then bound D_2 from below at 99.9% confidence per cell. The exact
    # sampler draws about 20k noise vectors a CPU second; 60k a side keeps the lower
    # bound within a few percent of the exact divergence, which is far below the charge.
    sigma, n = 0.6, 60_000
    rng = SecureRandom.from_seed("mc-gnmax")
    h = np.array([2.0, 1.0, 1.0, 0.0, 0.0])
    h2 = np.array([1.0, 2.0, 1.0, 0.0, 0.0])
    mech = from_config({"name": "gnmax", "sigma": sigma}, 5)
    p_counts = np.bincount(mech.decide(np.tile(h, (n, 1)), mech.draw_noise(n, rng))[0], minlength=5)
    q_counts = np.bincount(
        mech.decide(np.tile(h2, (n, 1)), mech.draw_noise(n, rng))[0], minlength=5
    )
    alpha = 1e-3
    p_lo = scipy.stats.beta.ppf(alpha / 2, p_counts, n - p_counts + 1)
    q_hi = scipy.stats.beta.ppf(1 - alpha / 2, q_counts + 1, n - q_counts)
    ok = p_counts > 0
    order = 2.0
    lower = math.log(np.sum(p_lo[ok] ** order * q_hi[ok] ** (1 - order))) / (order - 1)
    assert lower <= rdp.gnmax_data_independent(sigma, [order])[0]
    exact = renyi(
        argmax_probabilities(h, "gaussian", sigma),
        argmax_probabilities(h2, "gaussian", sigma),
        order,
    )
    assert lower <= exact


def test_data_dependent_gnmax_holds_for_every_neighbour() -> None:
    # Theorem 6 bounds D(M(h) || M(h')) for all neighbours h' of the given h.
    sigma = 1.0
    for h in (np.array([6.0, 1.0, 0.0]), np.array([8.0, 2.0, 0.0]), np.array([4.0, 4.0, 0.0])):
        bound = rdp.gnmax_data_dependent(h, sigma, ORDERS)
        p = argmax_probabilities(h, "gaussian", sigma)
        for h2 in _neighbours(h, 1.0):
            q = argmax_probabilities(h2, "gaussian", sigma)
            measured = np.array([renyi(p, q, a) for a in ORDERS])
            assert np.all(measured <= bound * (1 + 1e-6) + 1e-12)


def test_data_dependent_threshold_holds_for_every_neighbour() -> None:
    sigma1, threshold = 1.5, 10.0
    for top in (4.0, 9.0, 10.0, 16.0):
        h = np.array([top, 1.0, 0.0])
        bound = rdp.threshold_data_dependent(h, threshold, sigma1, ORDERS)
        p = scipy.stats.norm.sf(threshold - top, scale=sigma1)
        for moved in (top - 1, top + 1):
            q = scipy.stats.norm.sf(threshold - moved, scale=sigma1)
            measured = bernoulli_renyi(p, q, ORDERS)
            assert np.all(measured <= bound * (1 + 1e-6) + 1e-12)
