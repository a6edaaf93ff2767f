"""Exact sampling from the discrete Gaussian, with integer arithmetic only.

Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy"
(NeurIPS 2020), Algorithms 1-3. Given uniform random bits, every sample is
distributed exactly as N_Z(0, sigma2): P[x] proportional to exp(-x**2 / (2 sigma2))
over the integers. There is no floating point anywhere in the sampler, so the
floating-point attacks on textbook Laplace/Gaussian samplers (Mironov 2012) do
not apply. Adding independent N_Z(0, sigma2) to each coordinate of an
integer-valued statistic of L2 sensitivity D gives (order, order * D**2 / (2 sigma2))-RDP,
the same as the continuous Gaussian (ibid., Theorem 14 with Prop. 5).

The bits come from :class:`~capc.privacy.randomness.SecureRandom`, an AES-CTR
DRBG; the output is therefore computationally indistinguishable from exact.
"""

from __future__ import annotations

from fractions import Fraction
from math import isqrt

import numpy as np
from numpy.typing import NDArray

from capc.privacy.randomness import SecureRandom


def _bernoulli_exp_le1(gamma: Fraction, rng: SecureRandom) -> bool:
    # Algorithm 1, gamma in [0, 1]: P[K odd] = exp(-gamma).
    k = 1
    while rng.bernoulli(gamma.numerator, gamma.denominator * k):
        k += 1
    return k % 2 == 1


def bernoulli_exp_scalar(gamma: Fraction, rng: SecureRandom) -> bool:
    """True with probability exp(-gamma), exactly, for rational gamma >= 0."""
    if gamma < 0:
        raise ValueError(f"bernoulli_exp needs gamma >= 0, got {gamma}")
    while gamma > 1:
        if not _bernoulli_exp_le1(Fraction(1), rng):
            return False
        gamma -= 1
    return _bernoulli_exp_le1(gamma, rng)


def discrete_laplace_scalar(t: int, rng: SecureRandom) -> int:
    """One sample with P[x] proportional to exp(-|x| / t), t a positive integer (Algorithm 2)."""
    if t < 1:
        raise ValueError(f"discrete_laplace needs an integer scale t >= 1, got {t}")
    while True:
        u = rng.randbelow(t)
        if not bernoulli_exp_scalar(Fraction(u, t), rng):
            continue
        v = 0
        while bernoulli_exp_scalar(Fraction(1), rng):
            v += 1
        x = u + t * v
        negative = rng.bernoulli(1, 2)
        if negative and x == 0:
            continue
        return -x if negative else x


def sample_discrete_gaussian(sigma2: Fraction, rng: SecureRandom) -> int:
    """One exact sample of N_Z(0, sigma2) for rational sigma2 > 0 (Algorithm 3)."""
    if sigma2 <= 0:
        raise ValueError(f"discrete Gaussian variance must be > 0, got {sigma2}")
    t = isqrt(sigma2.numerator // sigma2.denominator) + 1
    while True:
        y = discrete_laplace_scalar(t, rng)
        gamma = (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        if bernoulli_exp_scalar(gamma, rng):
            return y


def variance_of(sigma: float) -> Fraction:
    """The exact rational variance for a noise scale given as a decimal float."""
    s = Fraction(repr(float(sigma)))
    if s <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    return s * s


def discrete_gaussian_noise(
    shape: int | tuple[int, ...], sigma: float, rng: SecureRandom
) -> NDArray[np.int64]:
    """An array of independent N_Z(0, sigma**2) samples (sigma read as its decimal value)."""
    sigma2 = variance_of(sigma)
    size = int(np.prod(shape))
    return np.fromiter(
        (sample_discrete_gaussian(sigma2, rng) for _ in range(size)), dtype=np.int64, count=size
    ).reshape(shape)
