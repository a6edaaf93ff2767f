"""Renyi differential privacy of one vote-aggregation query, per order.

Every function returns the RDP epsilon of ONE query at each Renyi order in
``orders`` (a 1-D array of orders > 1), in nats. Composition is a sum over
queries; conversion to (epsilon, delta) lives in :mod:`capc.privacy.conversion`.

Neighbouring relation throughout: two datasets that differ in one training
point of one teacher, so at most one teacher's vote changes on every query
(``docs/privacy.md`` derives each sensitivity).

Data-dependent bounds follow Papernot et al., "Scalable Private Learning with
PATE" (ICLR 2018): Theorem 6 with the orders of Proposition 7, in log space.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special
from numpy.typing import ArrayLike, NDArray

from capc.privacy import validation as check

FloatArray = NDArray[np.float64]


def _log1mexp(x: float) -> float:
    """log(1 - exp(x)) for x <= 0, accurate near 0 and for very negative x."""
    if x < -1.0:
        return math.log1p(-math.exp(x))
    if x < 0.0:
        return math.log(-math.expm1(x))
    if x == 0.0:
        return -math.inf
    raise ValueError(f"log1mexp needs a non-positive argument, got {x!r}")


def gaussian_rdp(l2_sensitivity: float, sigma: float, orders: ArrayLike) -> FloatArray:
    """RDP of the Gaussian mechanism: order * sensitivity**2 / (2 sigma**2).

    ``l2_sensitivity`` is the largest L2 change of the noised statistic between
    neighbouring datasets, in the statistic's units; ``sigma`` is the noise
    standard deviation in the same units. Post-processing (argmax, thresholds)
    never increases it.
    """
    s = check.non_negative(l2_sensitivity, "l2_sensitivity")
    sd = check.positive(sigma, "sigma")
    o = check.orders(orders)
    return o * (s * s) / (2.0 * sd * sd)


def gnmax_data_independent(sigma: float, orders: ArrayLike) -> FloatArray:
    """Data-independent RDP of one GNMax query: orders / sigma**2.

    One teacher moving its vote changes two counts by one: L2 sensitivity sqrt(2).
    """
    sd = check.positive(sigma, "sigma")
    return check.orders(orders) / (sd * sd)


def threshold_data_independent(sigma1: float, orders: ArrayLike) -> FloatArray:
    """Data-independent RDP of the Confident-GNMax threshold test: orders / (2 sigma1**2).

    The tested statistic, max(votes), moves by at most one.
    """
    sd = check.positive(sigma1, "sigma1")
    return check.orders(orders) / (2.0 * sd * sd)


def log_q_gnmax(votes: ArrayLike, sigma: float) -> float:
    """Log of the union bound on Pr[GNMax output != argmax(votes)].

    Each other class j is compared with the top class through the Gaussian tail
    of the vote gap at scale sqrt(2)*sigma (the difference of two noises), and
    the sum is capped at log(1 - 1/K) for K classes. Ties give gap 0 and tail 1/2.
    """
    v = check.votes(votes)
    sd = check.positive(sigma, "sigma")
    top = int(np.argmax(v))
    gaps = v[top] - np.delete(v, top)
    logq = float(scipy.special.logsumexp(scipy.special.log_ndtr(-gaps / (math.sqrt(2.0) * sd))))
    return min(logq, math.log(1.0 - 1.0 / v.size))


def rdp_from_log_q(logq: float, sigma: float, orders: FloatArray) -> FloatArray:
    """Theorem 6 of Papernot et al. 2018 given log q, capped by orders / sigma**2.

    ``sigma`` is the scale at which the mechanism is (order, order/sigma**2)-RDP;
    the higher orders mu1, mu2 are those of Proposition 7.
    """
    variance = sigma * sigma
    ret = orders / variance
    if math.isinf(logq) and logq < 0:
        # The output is certain: nothing about the data is revealed.
        return np.zeros_like(orders)
    mu_hi2 = math.sqrt(variance * -logq)
    mu_hi1 = mu_hi2 + 1.0
    mask = (mu_hi1 > orders) & (mu_hi2 > 1.0)
    if not mask.any():
        return ret
    rdp_hi1 = mu_hi1 / variance
    rdp_hi2 = mu_hi2 / variance
    log_a2 = (mu_hi2 - 1.0) * rdp_hi2
    # The range of q in which Theorem 6 holds for these mu1, mu2.
    q_in_range = logq <= log_a2 - mu_hi2 * (
        math.log(1.0 + 1.0 / (mu_hi1 - 1.0)) + math.log(1.0 + 1.0 / (mu_hi2 - 1.0))
    )
    inner = (logq + rdp_hi2) * (1.0 - 1.0 / mu_hi2)
    if not q_in_range or inner >= 0.0:
        return ret
    log1mq = _log1mexp(logq)
    log_a = (orders - 1.0) * (log1mq - _log1mexp(inner))
    log_b = (orders - 1.0) * (rdp_hi1 - logq / (mu_hi1 - 1.0))
    log_s = np.logaddexp(log1mq + log_a, logq + log_b)
    ret[mask] = np.minimum(ret, log_s / (orders - 1.0))[mask]
    return np.maximum(ret, 0.0)


def gnmax_data_dependent(votes: ArrayLike, sigma: float, orders: ArrayLike) -> FloatArray:
    """Data-dependent RDP of one GNMax query on ``votes`` with noise ``sigma``.

    Never above :func:`gnmax_data_independent`. Needs the clear histogram, so
    it is for central mode or a guardian allowed to learn vote gaps.
    """
    o = check.orders(orders)
    sd = check.positive(sigma, "sigma")
    return rdp_from_log_q(log_q_gnmax(votes, sd), sd, o)


def tested_max(votes: ArrayLike, threshold: float) -> float:
    """The max vote the threshold test is charged at: max(votes), or for a
    non-integer max x the point of [floor(x), ceil(x)] nearest ``threshold``.

    Integer maxima are kept as they are, so the charge is a function of the
    integer statistic that the smooth-sensitivity analysis enumerates. For a
    non-integer max, q = min(p, 1 - p) grows towards the threshold, so the
    point nearest it gives the largest q of the interval: never less than at x
    itself or at either rounding (plain rounding could under-charge).
    """
    v = check.votes(votes)
    t = check.non_negative(threshold, "threshold")
    x = float(v.max())
    lo, hi = math.floor(x), math.ceil(x)
    return float(lo) if lo == hi else min(max(t, float(lo)), float(hi))


def log_pr_answered(votes: ArrayLike, threshold: float, sigma1: float) -> float:
    """log p, p = Pr[m + N(0, sigma1**2) >= threshold], m = :func:`tested_max`.

    ``threshold`` and ``sigma1`` are in votes. Accurate however far m lies from
    the threshold; for log(1 - p) use :func:`log_pr_not_answered`, never
    log(1 - exp(log p)), which is -inf once p rounds to 1.
    """
    sd = check.positive(sigma1, "sigma1")
    return float(scipy.special.log_ndtr((tested_max(votes, threshold) - threshold) / sd))


def log_pr_not_answered(votes: ArrayLike, threshold: float, sigma1: float) -> float:
    """log(1 - p) for the p of :func:`log_pr_answered`, from the lower tail directly."""
    sd = check.positive(sigma1, "sigma1")
    return float(scipy.special.log_ndtr((threshold - tested_max(votes, threshold)) / sd))


def threshold_from_log_tails(
    log_pr: float, log_pr_not: float, sigma1: float, orders: FloatArray
) -> FloatArray:
    """Data-dependent RDP of the threshold test from log p and log(1 - p).

    ``log_pr`` = log Pr[answered], ``log_pr_not`` = log Pr[not answered], each
    computed from its own Gaussian tail so that q = min(p, 1 - p) keeps its
    digits at any gap; ``sigma1`` in votes; returns nats at each Renyi order.
    """
    logq = min(log_pr, log_pr_not)
    # The tested statistic has sensitivity 1 against GNMax's sqrt(2): hence the sqrt(2).
    # The explicit cap keeps the promise exact: (sqrt(2) sigma1)**2 may round above 2 sigma1**2.
    bound = rdp_from_log_q(logq, math.sqrt(2.0) * sigma1, orders)
    return np.minimum(bound, orders / (2.0 * sigma1 * sigma1))


def threshold_data_dependent(
    votes: ArrayLike, threshold: float, sigma1: float, orders: ArrayLike
) -> FloatArray:
    """Data-dependent RDP of the Confident-GNMax threshold test, in nats per order.

    Theorem 6 with log q = min(log p, log(1 - p)), p = Pr[answered] at the
    max vote of :func:`tested_max`, at noise sqrt(2)*sigma1 (``threshold``
    and ``sigma1`` in votes); never above orders / (2 sigma1**2).
    """
    o = check.orders(orders)
    sd = check.positive(sigma1, "sigma1")
    return threshold_from_log_tails(
        log_pr_answered(votes, threshold, sd), log_pr_not_answered(votes, threshold, sd), sd, o
    )


# ---------------------------------------------------------------------------
# Data-independent bounds of the other mechanisms. Each is the Gaussian
# mechanism at the L2 sensitivity derived in docs/privacy.md.
# ---------------------------------------------------------------------------


def laplace_noisy_max_rdp(scale: float, orders: ArrayLike) -> FloatArray:
    """RDP of Laplace noisy max with noise scale ``scale`` on every count.

    The mechanism is pure epsilon-DP with epsilon = 2 / scale (a vote move
    changes two counts in opposite directions). Pure DP gives RDP
    min(epsilon, order * epsilon**2 / 2) (Bun and Steinke 2016, Prop. 1.4).
    """
    b = check.positive(scale, "scale")
    o = check.orders(orders)
    eps = 2.0 / b
    return np.minimum(eps, o * eps * eps / 2.0)


def multilabel_binary(num_labels: int, sigma: float, orders: ArrayLike) -> FloatArray:
    """RDP of Binary voting over k labels: orders * k / (2 sigma**2).

    Each label's positive count moves by at most one, all k of them at once:
    L2 sensitivity sqrt(k). This is k times what one label costs; charging the
    single-label bound for k labels under-counts.
    """
    k = _positive_int(num_labels, "num_labels")
    return gaussian_rdp(math.sqrt(k), sigma, orders)


def tau_sensitivity(num_labels: int, tau: float) -> float:
    """L2 sensitivity of the summed tau-clipped votes: min(sqrt(2)*tau, sqrt(k)).

    Votes are non-negative with entries in [0, 1] and L2 norm <= tau, so two
    votes a, b satisfy |a - b|^2 <= |a|^2 + |b|^2 <= 2 tau^2 and |a - b|^2 <= k.
    """
    k = _positive_int(num_labels, "num_labels")
    t = check.positive(tau, "tau")
    return min(math.sqrt(2.0) * t, math.sqrt(k))


def multilabel_tau(num_labels: int, tau: float, sigma: float, orders: ArrayLike) -> FloatArray:
    """RDP of tau voting: the Gaussian mechanism at :func:`tau_sensitivity`."""
    return gaussian_rdp(tau_sensitivity(num_labels, tau), sigma, orders)


def multilabel_powerset(sigma: float, orders: ArrayLike) -> FloatArray:
    """RDP of Powerset voting: GNMax over label subsets, orders / sigma**2.

    A teacher's k-bit vote is one subset, so a vote change still moves two counts.
    """
    return gnmax_data_independent(sigma, orders)


def weighted_gnmax(weight: float, sigma: float, orders: ArrayLike) -> FloatArray:
    """Per-teacher RDP of GNMax with vote weight ``weight``: orders * w**2 / sigma**2."""
    w = check.non_negative(weight, "weight")
    return gaussian_rdp(math.sqrt(2.0) * w, sigma, orders)


def weighted_threshold(weight: float, sigma1: float, orders: ArrayLike) -> FloatArray:
    """Per-teacher RDP of the threshold test with vote weight ``weight``: orders * w**2 / (2 sigma1**2)."""
    w = check.non_negative(weight, "weight")
    return gaussian_rdp(w, sigma1, orders)


def upsampled_gnmax(replicas: int, sigma: float, orders: ArrayLike) -> FloatArray:
    """RDP of GNMax for a point trained on by ``replicas`` teachers: orders * u**2 / sigma**2.

    Changing the point can move u votes, all from the same class to the same other class.
    """
    u = _positive_int(replicas, "replicas")
    return gaussian_rdp(math.sqrt(2.0) * u, sigma, orders)


def upsampled_threshold(replicas: int, sigma1: float, orders: ArrayLike) -> FloatArray:
    """RDP of the threshold test for a point held by ``replicas`` teachers: orders * u**2 / (2 sigma1**2)."""
    u = _positive_int(replicas, "replicas")
    return gaussian_rdp(float(u), sigma1, orders)


def vanishing_expected(participation: float, sigma: float, orders: ArrayLike) -> FloatArray:
    """Expected per-query RDP of a GNMax teacher that votes with probability p.

    A teacher is charged orders / sigma**2 for each query it actually voted on
    and nothing otherwise (its data cannot influence a query it sat out); the
    expectation p * orders / sigma**2 is for planning, the ledger charges what
    happened. No amplification by subsampling is claimed.
    """
    p = check.probability(participation, "participation")
    return p * gnmax_data_independent(sigma, orders)


def _positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
