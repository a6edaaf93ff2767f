"""Releasing a data-dependent epsilon with smooth sensitivity.

A data-dependent epsilon is itself a function of the private votes, so it is
released with noise (Papernot et al. 2018, appendix B): at one Renyi order
lambda, the run's total data-dependent RDP R(H) is perturbed by
SS_beta(H) * N(0, sigma_ss**2), where SS_beta is a beta-smooth upper bound on
the local sensitivity of R. The release itself costs (their Theorem 23)
lambda * exp(2 beta) / sigma_ss**2 + (beta lambda - log(1 - 2 lambda beta) / 2) / (lambda - 1)
RDP at order lambda, for 1 < lambda < 1 / (2 beta); it is added before conversion.

To make the local sensitivity exactly computable, the released R is built
from two integer statistics of each histogram (vote counts of n teachers):
- the threshold test's RDP depends only on m = max(votes) (as in
  :func:`capc.privacy.rdp.threshold_data_dependent`); one vote move changes it by <= 1;
- GNMax is charged Theorem 6 at q <= min(1 - 1/K, (K - 1) * Pr[N(0, 2 sigma**2) >= g]),
  with g the gap between the two largest counts: a valid upper bound on the
  probability of a wrong answer (every other class is at least g behind), at
  most K - 1 times the union bound of :func:`capc.privacy.rdp.log_q_gnmax`.
  One vote move changes g by <= 2.
A changed teacher moves its vote and never adds or withdraws one, so every
dataset at any distance has the same vote total s on each query. Only the
values a histogram of K counts summing to s can take are enumerated
(:func:`reachable_maxima`, :func:`reachable_gaps`): m in [ceil(s/K), s], and
g in [0, s] but never s - 1 (and only g of the parity of s when K = 2). The
largest one-move change of the RDP between such values anywhere within
distance d is found by enumeration, with no approximation. Tables are still
tabulated on {0, ..., n}; impossible entries are never read.

Exact release. The released figure is R(H) + SS_beta(H) * N(0, sigma_ss**2)
with the Gaussian exact and continuous, rounded to a multiple of
``RELEASE_GRID`` (2^-20 nats of RDP) by Karney's sampler
(:mod:`capc.privacy.rounded_gaussian`): post-processing of the continuous
release the theorem above is about, so its cost holds exactly. R and SS are
floats, deterministic functions of the votes, and enter as their exact
values. It used to add a float Box-Muller draw to R, and a float sum leaks
its summands: the round trip fl(fl(v - R) + R) = v holds for the R that
produced v and fails for a neighbour's R on some draws, which then tell the
two apart with certainty (``tests/unit/test_smooth_sensitivity.py``).
Only ``noisy_rdp`` and what is computed from it (``epsilon``) are released;
``expected_epsilon``, ``epsilon_std``, ``smooth_sensitivity`` and
``data_dependent_rdp`` are noiseless functions of the votes, diagnostics for
whoever holds them (``capc privacy cost --sanitise`` prints them beside the
unsanitised data-dependent curve). It is a side figure of central-mode
experiments (:mod:`capc.learning.pate`, ``capc privacy --sanitise``): never
a label, never charged on a ledger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.special
from numpy.typing import ArrayLike, NDArray

from capc.privacy import rdp, rounded_gaussian
from capc.privacy import validation as check
from capc.privacy.conversion import Conversion, convert
from capc.privacy.randomness import SecureRandom

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class SanitisedEpsilon:
    """A data-dependent epsilon released with smooth-sensitivity noise, and how.

    Released: ``noisy_rdp`` (nats, a multiple of :data:`RELEASE_GRID`), ``epsilon`` (its
    conversion) and the parameters. ``expected_epsilon``, ``epsilon_std``,
    ``smooth_sensitivity`` and ``data_dependent_rdp`` are noiseless: never publish them."""

    epsilon: float
    noisy_rdp: float
    expected_epsilon: float
    epsilon_std: float
    delta: float
    order: float
    beta: float
    sigma_ss: float
    smooth_sensitivity: float
    data_dependent_rdp: float
    release_rdp: float


#: The released RDP is a multiple of this (nats).
RELEASE_GRID = Fraction(1, 1 << 20)


def released_rdp(total: float, scale: float, rng: SecureRandom) -> float:
    """``total`` + N(0, ``scale``**2), exact and continuous, rounded to a multiple of
    :data:`RELEASE_GRID` (nats); ``scale`` 0 releases ``total`` rounded (nothing to hide)."""
    if not (math.isfinite(total) and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"need a finite total and scale >= 0, got {total} and {scale}")
    if scale == 0:
        return float(round(Fraction(total) / RELEASE_GRID) * RELEASE_GRID)
    m = rounded_gaussian.sample_rounded_gaussian(
        Fraction(total), Fraction(scale), RELEASE_GRID, rng
    )
    return float(m * RELEASE_GRID)


def release_rdp(beta: float, sigma_ss: float, order: float) -> float:
    """RDP at ``order`` of adding SS_beta * N(0, sigma_ss**2) (Theorem 23)."""
    b = check.positive(beta, "beta")
    s = check.positive(sigma_ss, "sigma_ss")
    lam = float(order)
    if not 1.0 < lam < 1.0 / (2.0 * b):
        raise ValueError(f"order {lam} must lie in (1, 1/(2 beta)) = (1, {1.0 / (2.0 * b):g})")
    return lam * math.exp(2.0 * b) / (s * s) + (b * lam - 0.5 * math.log(1.0 - 2.0 * lam * b)) / (
        lam - 1.0
    )


def gnmax_gap_table(num_teachers: int, num_classes: int, sigma: float, order: float) -> FloatArray:
    """RDP at ``order`` of GNMax charged through the top-two gap g, for g = 0..n. Shape (n + 1,)."""
    gaps = np.arange(num_teachers + 1, dtype=np.float64)
    cap = math.log(1.0 - 1.0 / num_classes)
    logq = np.minimum(
        math.log(num_classes - 1) + scipy.special.log_ndtr(-gaps / (math.sqrt(2.0) * sigma)), cap
    )
    o = np.array([order])
    return np.array([rdp.rdp_from_log_q(float(x), sigma, o)[0] for x in logq])


def threshold_table(num_teachers: int, threshold: float, sigma1: float, order: float) -> FloatArray:
    """RDP at ``order`` of the threshold test for max vote m = 0..n. Shape (n + 1,)."""
    maxima = np.arange(num_teachers + 1, dtype=np.float64)
    # Each tail from its own side: 1 - p rounds to 0 once max - T passes ~37 sigma1.
    log_p = scipy.special.log_ndtr((maxima - threshold) / sigma1)
    log_not = scipy.special.log_ndtr((threshold - maxima) / sigma1)
    o = np.array([order])
    return np.array(
        [
            rdp.threshold_from_log_tails(float(lp), float(ln), sigma1, o)[0]
            for lp, ln in zip(log_p, log_not, strict=True)
        ]
    )


def reachable_maxima(total: int, num_classes: int, size: int) -> BoolArray:
    """Which m in 0..size-1 is the top count of some K-class histogram summing to ``total``.

    The top of K counts summing to s is at least ceil(s / K) and at most s; every
    value between is the top of (m, s - m spread over the others) when it fits.
    """
    m = np.arange(size)
    return (m >= -(-total // num_classes)) & (m <= total)


def reachable_gaps(total: int, num_classes: int, size: int) -> BoolArray:
    """Which g in 0..size-1 is the top-two gap of some K-class histogram summing to ``total``.

    With second count b, top g + b and r = s - g: the other K - 2 counts hold
    r - 2b, each at most b, so g occurs iff some integer b has r / K <= b <= r / 2.
    """
    r = total - np.arange(size)
    return (r >= 0) & (-(-r // num_classes) <= r // 2)


def _one_move_change(table: FloatArray, step: int, reachable: BoolArray) -> FloatArray:
    """Largest |table[y] - table[x]| over reachable y with 0 < |y - x| <= step, per reachable x.

    Zero at unreachable x: no dataset has that statistic, so its change is never charged.
    """
    out = np.zeros_like(table)
    for s in range(1, step + 1):
        diff = np.abs(table[s:] - table[:-s])
        diff[~(reachable[s:] & reachable[:-s])] = 0.0
        out[:-s] = np.maximum(out[:-s], diff)
        out[s:] = np.maximum(out[s:], diff)
    return out


class _WindowMax:
    """max of a per-position array over [x - w*d, x + w*d], grown one d at a time."""

    def __init__(self, values: FloatArray, positions: IntArray, width: int) -> None:
        self.values = values
        self.pos = positions
        self.width = width
        self.current = values[positions].copy()
        self.d = 0

    def grow(self) -> FloatArray:
        self.d += 1
        last = self.values.size - 1
        for s in range(self.width * (self.d - 1) + 1, self.width * self.d + 1):
            self.current = np.maximum(self.current, self.values[np.minimum(self.pos + s, last)])
            self.current = np.maximum(self.current, self.values[np.maximum(self.pos - s, 0)])
        return self.current


def sanitise(
    histograms: ArrayLike,
    answered: ArrayLike,
    num_teachers: int,
    sigma2: float,
    order: float,
    delta: float,
    rng: SecureRandom,
    threshold: float | None = None,
    sigma1: float | None = None,
    beta: float | None = None,
    sigma_ss: float = 10.0,
) -> SanitisedEpsilon:
    """Release the data-dependent epsilon of a GNMax or Confident-GNMax run.

    ``histograms``: (queries, classes) integer vote counts of ``num_teachers``
    teachers; ``answered``: (queries,) which queries released a label (all True
    for plain GNMax). With ``threshold`` and ``sigma1`` each query is also
    charged its threshold test. ``order``: the Renyi order lambda of the
    release; ``beta`` defaults to 0.2 / lambda; ``delta`` in (0, 1).
    """
    h = check.histograms(histograms)
    if not np.array_equal(h, np.rint(h)) or h.sum(axis=1).max() > num_teachers:
        raise ValueError(
            f"histograms must hold integer vote counts of at most {num_teachers} teachers"
        )
    ans = np.asarray(answered, dtype=bool)
    if ans.shape != (h.shape[0],):
        raise ValueError(f"answered must have shape ({h.shape[0]},), got {ans.shape}")
    s2 = check.positive(sigma2, "sigma2")
    lam = float(check.orders([order])[0])
    b = 0.2 / lam if beta is None else check.positive(beta, "beta")
    cost = release_rdp(b, sigma_ss, lam)

    srt = np.sort(h, axis=1).astype(np.int64)
    k = h.shape[1]
    votes_cast = srt.sum(axis=1)
    gaps = srt[:, -1] - srt[:, -2]
    gn = gnmax_gap_table(num_teachers, k, s2, lam)
    total = float(gn[gaps[ans]].sum())
    thr: FloatArray | None = None
    if threshold is not None:
        if sigma1 is None:
            raise ValueError("a threshold test needs sigma1")
        thr = threshold_table(
            num_teachers,
            check.non_negative(threshold, "threshold"),
            check.positive(sigma1, "sigma1"),
            lam,
        )
        total += float(thr[srt[:, -1]].sum())
    # Queries with the same vote total share what their statistics can reach.
    windows = []
    for cast in np.unique(votes_cast):
        same = votes_cast == cast
        size = num_teachers + 1
        gn_change = _one_move_change(gn, 2, reachable_gaps(int(cast), k, size))
        windows.append(_WindowMax(gn_change, gaps[same & ans], 2))
        if thr is not None:
            thr_change = _one_move_change(thr, 1, reachable_maxima(int(cast), k, size))
            windows.append(_WindowMax(thr_change, srt[same, -1], 1))

    # LS at distance 0, then grow the windows until the discount rules out any larger value.
    global_bound = sum(float(w.values.max()) * w.pos.size for w in windows)
    best = sum(float(w.current.sum()) for w in windows)
    d = 0
    while math.exp(-b * (d + 1)) * global_bound > best and d < 4 * num_teachers:
        d += 1
        ls = sum(float(w.grow().sum()) for w in windows)
        best = max(best, math.exp(-b * d) * ls)

    noisy = released_rdp(total, best * sigma_ss, rng)
    o = np.array([lam])
    eps = convert(np.array([max(0.0, noisy) + cost]), o, delta, Conversion.IMPROVED).epsilon
    expected = convert(np.array([total + cost]), o, delta, Conversion.IMPROVED).epsilon
    return SanitisedEpsilon(
        epsilon=eps,
        noisy_rdp=noisy,
        expected_epsilon=expected,
        epsilon_std=best * sigma_ss,
        delta=float(delta),
        order=lam,
        beta=b,
        sigma_ss=float(sigma_ss),
        smooth_sensitivity=best,
        data_dependent_rdp=total,
        release_rdp=cost,
    )
