"""The exact discrete Gaussian sampler matches its probability mass function."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import scipy.stats

from capc.privacy import discrete_gaussian as dg
from capc.privacy.randomness import SecureRandom


def test_bernoulli_exp_frequency() -> None:
    rng = SecureRandom.from_seed("bexp")
    for gamma in (Fraction(1, 3), Fraction(5, 2)):
        hits = sum(dg.bernoulli_exp_scalar(gamma, rng) for _ in range(20_000))
        p = float(np.exp(-float(gamma)))
        assert abs(hits / 20_000 - p) < 4 * np.sqrt(p * (1 - p) / 20_000)


@pytest.mark.parametrize("sigma", [0.7, 3.0])
def test_pmf_chi_square(sigma: float) -> None:
    rng = SecureRandom.from_seed(f"dg-{sigma}")
    n = 20_000
    x = dg.discrete_gaussian_noise(n, sigma, rng)
    support = np.arange(-int(8 * sigma) - 2, int(8 * sigma) + 3)
    weights = np.exp(-(support.astype(float) ** 2) / (2 * sigma**2))
    pmf = weights / weights.sum()
    observed = np.array([(x == s).sum() for s in support])
    keep = pmf * n >= 5
    expected = pmf[keep] * n
    obs = observed[keep]
    stat = ((obs - expected) ** 2 / expected).sum()
    assert scipy.stats.chi2.sf(stat, keep.sum() - 1) > 1e-4
    assert (observed[~keep].sum()) <= 5 * max(1.0, (pmf[~keep] * n).sum()) + 5


def test_variance_is_exact_decimal() -> None:
    assert dg.variance_of(0.1) == Fraction(1, 100)
    with pytest.raises(ValueError):
        dg.variance_of(0.0)
