"""Exact samples of a continuous Gaussian, rounded to a grid: round((c + s Z) / g), Z ~ N(0, 1).

Why rounding, not the discrete Gaussian. A released number c + s Z cannot be
represented, and a float sampler's outputs form a sparse set that gives the
secret away (Mironov 2012). Rounding the *exact* continuous value to a fixed
grid is post-processing of the continuous Gaussian mechanism: the released
integer has every guarantee the continuous mechanism has, in every accountant
(Renyi DP and exact Gaussian DP, mu-GDP, alike), whatever c is. The discrete
Gaussian of Canonne, Kamath and Steinke (2020) has the same Renyi DP on
integer-valued statistics, but not exactly the same Gaussian-DP trade-off
curve (a lattice law is more distinguishable than mu = D / s at small s), so
it does not fit a ledger that accounts in mu-GDP.

How it is exact. Z is drawn by Karney's algorithm ("Sampling exactly from the
normal distribution", ACM TOMS 2016): an integer k >= 0 with probability
proportional to exp(-k / 2), kept with probability exp(-k (k - 1) / 2), then
a uniform fraction x in [0, 1) kept with probability exp(-x (x + 2k) / 2),
and Z = +-(k + x). Every step is an exact Bernoulli(exp(-1/2)) (Canonne, Kamath
and Steinke 2020, Algorithm 1, in integers) or a comparison of
uniform numbers whose binary digits are drawn only as far as the comparison
needs (von Neumann's trick, as Karney generalises it). The fraction x is
never rounded: its digits are drawn until (c + s Z) / g lies between two
consecutive half-integers, and the integer between them is the sample.
Given uniform bits the law is exactly P[m] = Phi(((m + 1/2) g - c) / s) -
Phi(((m - 1/2) g - c) / s); the bits come from
:class:`~capc.privacy.randomness.SecureRandom` (AES-CTR), so the output is
computationally indistinguishable from exact. Pure Python, 34 to 51 us a
sample on the loaded 2-core machine.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from capc.privacy.randomness import SecureRandom

#: Binary digits drawn at a time for a uniform fraction.
_DIGIT_BITS = 32
_DIGIT = 1 << _DIGIT_BITS

#: The grid :func:`noise` rounds to: multiples of 2**-GRID_BITS. The circuits round noise
#: to at most 24 fractional bits (capc.mechanisms.base), so rounding there again is
#: rounding a function of the exact value again: still post-processing.
GRID_BITS = 24

_HALF = Fraction(1, 2)


class _Uniform:
    """A uniform number in [0, 1) whose binary digits are drawn only when a comparison
    needs them (a "u-rand"): after n digits it lies in [d / 2^(32 n), (d + 1) / 2^(32 n))."""

    __slots__ = ("digits", "rng")

    def __init__(self, rng: SecureRandom) -> None:
        self.rng = rng
        self.digits: list[int] = []

    def digit(self, i: int) -> int:
        while len(self.digits) <= i:
            self.digits.append(self.rng.randbelow(_DIGIT))
        return self.digits[i]

    def less_than(self, other: _Uniform) -> bool:
        """Whether self < other (two independent uniforms are equal with probability 0)."""
        i = 0
        while True:
            a, b = self.digit(i), other.digit(i)
            if a != b:
                return a < b
            i += 1

    def prefix(self) -> tuple[int, int]:
        """(d, bits): the digits drawn so far confine the number to [d, d + 1) / 2^bits."""
        d = 0
        for x in self.digits:
            d = (d << _DIGIT_BITS) | x
        return d, _DIGIT_BITS * len(self.digits)

    def refine(self) -> None:
        self.digit(len(self.digits))


def _exp_minus_x_shifted(x: _Uniform, k: int, rng: SecureRandom) -> bool:
    """True with probability exp(-x (x + 2k) / (2k + 2)), for the uniform x.

    The largest n with x > U_1 > ... > U_n and V_i < (x + 2k) / (2k + 2) for i <= n has
    P[n >= j] = (x (x + 2k) / (2k + 2))^j / j!, so P[n even] is the exponential. V_i < c
    is decided without V's digits where possible: (2k + 2) V has integer part r uniform
    on [0, 2k + 2), and V < c iff r < 2k, or r = 2k and the fraction is below x."""
    previous = x
    n = 0
    while True:
        u = _Uniform(rng)
        if not u.less_than(previous):
            break
        r = rng.randbelow(2 * k + 2)
        if r == 2 * k + 1 or (r == 2 * k and not _Uniform(rng).less_than(x)):
            break
        n += 1
        previous = u
    return n % 2 == 0


def _exp_minus_half(rng: SecureRandom) -> bool:
    """True with probability exp(-1/2), exactly, in integers: K, the first k whose
    Bernoulli(1 / (2k)) fails, is odd with probability exp(-1/2) (Canonne, Kamath and
    Steinke 2020, Algorithm 1; :func:`capc.privacy.discrete_gaussian.bernoulli_exp_scalar` with
    the Fractions taken out, which this hot loop cannot afford)."""
    k = 1
    while rng.randbelow(2 * k) == 0:
        k += 1
    return k % 2 == 1


def _standard(rng: SecureRandom) -> tuple[int, int, _Uniform]:
    """One exact N(0, 1) sample Z = sign (k + x): (sign in {-1, 1}, k, x undrawn-digit uniform)."""
    while True:
        k = 0
        while _exp_minus_half(rng):
            k += 1
        # exp(-k (k - 1) / 2) as k (k - 1) draws at exp(-1/2).
        if not all(_exp_minus_half(rng) for _ in range(k * (k - 1))):
            continue
        x = _Uniform(rng)
        # exp(-x (x + 2k) / 2) as k + 1 draws at exp(-x (x + 2k) / (2k + 2)).
        if all(_exp_minus_x_shifted(x, k, rng) for _ in range(k + 1)):
            return (1 if rng.randbelow(2) else -1), k, x


def sample_rounded_gaussian(
    center: Fraction, scale: Fraction, grid: Fraction, rng: SecureRandom
) -> int:
    """The integer m nearest (center + scale Z) / grid, Z ~ N(0, 1), exactly.

    ``center`` and ``grid`` in the released value's unit, ``scale`` (the standard deviation)
    too; all exact rationals (a float converts exactly: ``Fraction(0.1)`` is the double's
    value). The released number is m * grid."""
    if scale <= 0 or grid <= 0:
        raise ValueError(f"the scale and the grid must be positive, got {scale} and {grid}")
    return _Rounding(center / grid + _HALF, scale / grid).draw(rng)


class _Rounding:
    """floor(a + b Z) for exact rationals a and b > 0, in integers: with a = an / ad and
    b = bn / bd, a + b sign (k + d / 2^n) = (an bd 2^n + sign bn ad (k 2^n + d)) / (ad bd 2^n)."""

    __slots__ = ("ad", "an", "bd", "bn")

    def __init__(self, a: Fraction, b: Fraction) -> None:
        self.an, self.ad = a.numerator, a.denominator
        self.bn, self.bd = b.numerator, b.denominator

    def draw(self, rng: SecureRandom) -> int:
        sign, k, x = _standard(rng)
        while True:
            d, bits = x.prefix()
            base = self.an * self.bd << bits
            step = sign * self.bn * self.ad
            den = self.ad * self.bd << bits
            # x lies strictly inside [d, d + 1) / 2^bits (its ends have probability 0), so
            # a + b Z lies strictly between these two values; one floor for both decides.
            ends = (base + step * ((k << bits) + d), base + step * ((k << bits) + d + 1))
            lo, hi = min(ends), max(ends)
            m = lo // den
            if hi <= (m + 1) * den:
                return m
            x.refine()


def rounded_gaussian_noise(
    shape: int | tuple[int, ...], sigma: float, rng: SecureRandom, grid_bits: int = GRID_BITS
) -> NDArray[np.float64]:
    """Independent N(0, sigma**2) draws rounded to multiples of 2**-grid_bits, exactly, in an
    array of ``shape`` (units of sigma, e.g. votes). ``sigma`` is taken at its exact binary
    value. Every value is a float64 exactly (|m| < 2^53 for sigma < 2^20)."""
    s = float(sigma)
    if not (math.isfinite(s) and 0 < s < 2.0**20):
        raise ValueError(f"sigma must be positive and below 2^20, got {sigma!r}")
    if not 0 <= grid_bits <= 30:
        raise ValueError(f"grid_bits must lie in [0, 30], got {grid_bits}")
    size = int(np.prod(shape))
    grid = Fraction(1, 1 << grid_bits)
    rounding = _Rounding(_HALF, Fraction(s) / grid)
    m = np.fromiter((rounding.draw(rng) for _ in range(size)), dtype=np.int64, count=size)
    return (m.astype(np.float64) * float(grid)).reshape(shape)
