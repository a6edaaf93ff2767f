"""Exact Renyi divergences between output distributions of noisy-argmax mechanisms.

Used by the empirical sensitivity tests: they compute what a mechanism really
leaks on neighbouring histograms and compare it with what the library charges.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special
import scipy.stats
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


def argmax_probabilities(
    hist: FloatArray, noise: str, scale: float, points: int = 200_001
) -> FloatArray:
    """P[argmax(hist + noise) = i] for i.i.d. Gaussian (sd=scale) or Laplace noise, by quadrature.

    P[i] = integral of f(x - h_i) * prod_{j != i} F(x - h_j) dx on a fine grid.
    """
    dist = (
        scipy.stats.norm(scale=scale) if noise == "gaussian" else scipy.stats.laplace(scale=scale)
    )
    width = 40.0 * scale
    x = np.linspace(hist.min() - width, hist.max() + width, points)
    dx = x[1] - x[0]
    log_cdf = np.stack([dist.logcdf(x - h) for h in hist])
    log_pdf = np.stack([dist.logpdf(x - h) for h in hist])
    total = log_cdf.sum(axis=0)
    probs = []
    for i in range(hist.size):
        integrand = log_pdf[i] + total - log_cdf[i]
        probs.append(np.exp(scipy.special.logsumexp(integrand) + math.log(dx)))
    p = np.array(probs)
    return np.asarray(p / p.sum(), dtype=np.float64)


def renyi(p: FloatArray, q: FloatArray, order: float) -> float:
    """D_order(P || Q) for discrete distributions, in nats."""
    mask = p > 0
    terms = order * np.log(p[mask]) + (1.0 - order) * np.log(q[mask])
    return float(scipy.special.logsumexp(terms) / (order - 1.0))


def bernoulli_renyi(
    p: float | FloatArray, q: float | FloatArray, order: float | FloatArray
) -> FloatArray:
    """D_order(Bern(p) || Bern(q)), elementwise, computed in log space."""
    p_arr, q_arr = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    return log_bernoulli_renyi(
        np.log(p_arr), np.log1p(-p_arr), np.log(q_arr), np.log1p(-q_arr), order
    )


def log_bernoulli_renyi(
    logp: FloatArray,
    log1mp: FloatArray,
    logq: FloatArray,
    log1mq: FloatArray,
    order: float | FloatArray,
) -> FloatArray:
    """D_order(Bern(p) || Bern(q)) from the logs of p, 1-p, q, 1-q (no cancellation anywhere)."""
    a = order * logp + (1.0 - order) * logq
    b = order * log1mp + (1.0 - order) * log1mq
    return np.asarray(np.logaddexp(a, b) / (order - 1.0))


def thresholded_gaussian_worst(shift: float, sigma: float, order: float) -> float:
    """sup over thresholds t of D_order between [z >= t] and [z + shift >= t], z ~ N(0, sigma**2).

    Both directions, over a fine grid of t: the worst a single released bit
    can leak when its noised statistic moves by ``shift``.
    """
    t = np.linspace(-15 * sigma, 15 * sigma + shift, 6001)
    logp, log1mp = scipy.stats.norm.logsf(t, scale=sigma), scipy.stats.norm.logcdf(t, scale=sigma)
    logq, log1mq = (
        scipy.stats.norm.logsf(t - shift, scale=sigma),
        scipy.stats.norm.logcdf(t - shift, scale=sigma),
    )
    forward = log_bernoulli_renyi(logp, log1mp, logq, log1mq, order)
    backward = log_bernoulli_renyi(logq, log1mq, logp, log1mp, order)
    return float(max(forward.max(), backward.max()))
