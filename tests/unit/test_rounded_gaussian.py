"""The exact rounded Gaussian against its law written out independently (normal cdf
differences), and the noise the mechanisms add is that law, on its grid.

Frequency tests are chi-square tests at fixed seeds; their teeth: the same counts
reject a scale 10% off and a centre a fifth of a grid step off."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import chisquare, norm

from capc.mechanisms.base import gaussian_noise
from capc.privacy import rounded_gaussian as rg
from capc.privacy.randomness import SecureRandom

N = 30_000


def chi2_pvalue(m: np.ndarray, center: float, scale: float, grid: float) -> float:
    """p-value of integer samples m against P[m] = Phi(((m + 1/2) g - c) / s) - Phi(...),
    the tails pooled in one bin."""
    lo = int(np.floor((center - 6 * scale) / grid))
    hi = int(np.ceil((center + 6 * scale) / grid))
    support = np.arange(lo, hi + 1)
    pmf = norm.cdf(((support + 0.5) * grid - center) / scale) - norm.cdf(
        ((support - 0.5) * grid - center) / scale
    )
    observed = np.array([(m == v).sum() for v in support], dtype=np.float64)
    keep = pmf * len(m) >= 5
    obs = np.append(observed[keep], len(m) - observed[keep].sum())
    exp = np.append(pmf[keep] * len(m), len(m) * (1 - pmf[keep].sum()))
    return float(chisquare(obs, exp).pvalue)


def draws(center: Fraction, scale: Fraction, grid: Fraction, seed: str, n: int = N) -> np.ndarray:
    rng = SecureRandom.from_seed(seed)
    return np.array([rg.sample_rounded_gaussian(center, scale, grid, rng) for _ in range(n)])


@pytest.mark.parametrize(
    ("center", "scale", "grid"),
    [
        (Fraction(0), Fraction(1), Fraction(1, 4)),
        (Fraction(3, 10), Fraction(7, 10), Fraction(1, 5)),
    ],
)
def test_rounded_gaussian_has_its_exact_law_and_not_its_neighbours(
    center: Fraction, scale: Fraction, grid: Fraction
) -> None:
    m = draws(center, scale, grid, f"rg{center}{scale}")
    c, s, g = float(center), float(scale), float(grid)
    assert chi2_pvalue(m, c, s, g) > 1e-3
    assert chi2_pvalue(m, c, 1.1 * s, g) < 1e-6
    assert chi2_pvalue(m, c + g / 5, s, g) < 1e-6


def test_a_fine_grid_refines_the_fraction_and_keeps_the_law() -> None:
    # 2^-40 of a unit: the fraction's digits are drawn well past the first 32 bits.
    grid = Fraction(1, 1 << 40)
    m = draws(Fraction(1, 3), Fraction(2), grid, "fine", 8_000)
    coarse = np.floor(m * float(grid) * 2 + 0.5).astype(np.int64)  # to a grid of 1/2
    assert chi2_pvalue(coarse, 1 / 3, 2.0, 0.5) > 1e-3
    assert len(np.unique(m)) == len(m)  # no two draws share a point of so fine a grid


def test_mechanism_noise_is_the_exact_law_on_its_grid() -> None:
    # A float sampler (Box-Muller, what GNMax used to add) is almost never on this grid.
    noise = gaussian_noise((N // 10, 10), 3.0, SecureRandom.from_seed("mech"))
    scaled = noise * 2.0**rg.GRID_BITS
    assert np.array_equal(scaled, np.rint(scaled))
    as_quarters = np.floor(noise.ravel() * 4 + 0.5).astype(np.int64)
    assert chi2_pvalue(as_quarters, 0.0, 3.0, 0.25) > 1e-3
    old = SecureRandom.from_seed("old").normal(1000, 3.0) * 2.0**rg.GRID_BITS
    assert not np.array_equal(old, np.rint(old))


def test_noise_refuses_what_it_cannot_represent() -> None:
    rng = SecureRandom.from_seed("bad")
    for sigma in (0.0, -1.0, float("inf"), 2.0**21):
        with pytest.raises(ValueError, match="sigma"):
            rg.rounded_gaussian_noise(3, sigma, rng)
    with pytest.raises(ValueError, match="grid_bits"):
        rg.rounded_gaussian_noise(3, 1.0, rng, grid_bits=31)
    with pytest.raises(ValueError, match="positive"):
        rg.sample_rounded_gaussian(Fraction(0), Fraction(0), Fraction(1), rng)
