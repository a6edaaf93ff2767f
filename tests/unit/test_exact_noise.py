"""The batch exact samplers against their distributions written out independently.

Each frequency test compares counts with the exact probabilities by a
chi-square test at a fixed seed; its teeth: the same counts reject the
neighbouring scale, so a sampler off by one in t fails.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import chisquare

from capc.privacy import exact_noise
from capc.privacy.randomness import SecureRandom

N = 200_000


def discrete_laplace_pmf(t: int, values: np.ndarray) -> np.ndarray:
    q = math.exp(-1.0 / t)
    out: np.ndarray = (1 - q) / (1 + q) * q ** np.abs(values)
    return out


def chi2_pvalue(samples: np.ndarray, pmf: np.ndarray, support: np.ndarray) -> float:
    """Chi-square p-value of samples against pmf on support, the tails pooled in one bin."""
    observed = np.array([(samples == v).sum() for v in support], dtype=np.float64)
    expected = pmf * len(samples)
    observed = np.append(observed, len(samples) - observed.sum())
    expected = np.append(expected, len(samples) - expected.sum())
    return float(chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("t", [1, 3, 10])
def test_discrete_laplace_has_its_exact_law_and_not_its_neighbours(t: int) -> None:
    z = exact_noise.discrete_laplace(t, (N // 4, 4), SecureRandom.from_seed(f"dl{t}"))
    assert z.shape == (N // 4, 4) and z.dtype == np.int64
    flat = z.ravel()
    support = np.arange(-4 * t, 4 * t + 1)
    assert chi2_pvalue(flat, discrete_laplace_pmf(t, support), support) > 1e-3
    assert chi2_pvalue(flat, discrete_laplace_pmf(t + 1, support), support) < 1e-6
    assert abs(flat.mean()) < 5 * math.sqrt(2 * t * t / N + 1 / N)  # symmetric


def test_geometric_law() -> None:
    t = 4
    g = exact_noise.geometric(t, N, SecureRandom.from_seed("geo"))
    q = math.exp(-1 / t)
    support = np.arange(0, 30)
    assert g.min() >= 0
    assert chi2_pvalue(g, (1 - q) * q**support, support) > 1e-3


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(7, 3)])
def test_bernoulli_exp_has_probability_exp_minus_gamma(gamma: Fraction) -> None:
    b = exact_noise.bernoulli_exp(gamma, N, SecureRandom.from_seed(str(gamma)))
    p = math.exp(-gamma)
    assert abs(b.mean() - p) <= 5 * math.sqrt(p * (1 - p) / N) + 1e-12
    with pytest.raises(ValueError, match="gamma"):
        exact_noise.bernoulli_exp(Fraction(-1), 3, SecureRandom.from_seed(0))


def test_randbelow_is_uniform_and_in_range() -> None:
    rng = SecureRandom.from_seed("rb")
    x = exact_noise.randbelow(6, N, rng)
    assert x.min() == 0 and x.max() == 5
    assert chi2_pvalue(x, np.full(6, 1 / 6), np.arange(6)) > 1e-3
    assert (exact_noise.randbelow(1, 10, rng) == 0).all()
    big = exact_noise.randbelow(2**63, 1000, rng)
    assert big.min() >= 0
    with pytest.raises(ValueError, match="randbelow"):
        exact_noise.randbelow(0, 1, rng)


def test_same_seed_same_noise() -> None:
    a = exact_noise.discrete_laplace(7, 50, SecureRandom.from_seed(9))
    b = exact_noise.discrete_laplace(7, 50, SecureRandom.from_seed(9))
    np.testing.assert_array_equal(a, b)
