"""Single-label aggregation: GNMax, Confident-GNMax and Laplace noisy max.

Histograms have shape (queries, classes): entry [b, j] is the (possibly
weighted) number of teachers voting class j on query b. Every mechanism has a
``*_decide`` form that takes the noise explicitly (what the secure circuits
must reproduce bit for bit) and a sampling form that draws the noise from a
:class:`~capc.privacy.randomness.SecureRandom`. Ties go to the lowest class index.

Exact noise. Gaussian noise is the exact continuous N(0, sigma**2) rounded to
multiples of 2^-24 (:mod:`capc.privacy.rounded_gaussian`, Karney's exact
sampler): h + round(eta) = round(h + eta) for counts on that grid (integer
counts; the services' fixed-point shares, at most 24 fractional bits), so
every answer is a post-processing of the continuous Gaussian mechanism and
keeps its Renyi-DP and Gaussian-DP guarantees exactly. Counts off the grid
(arbitrary float weights) are not covered exactly: weight votes on a grid
(rounded down, as :meth:`capc.mechanisms.base.Mechanism.encode_votes` does).
``discrete=True`` draws the integer discrete Gaussian instead (Canonne, Kamath
and Steinke 2020): the same Renyi DP on integer counts, not the same
Gaussian-DP curve. LNMax adds exact discrete Laplace noise on a grid of
1/``LAPLACE_RESOLUTION`` (:func:`laplace_noisy_max`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.privacy import discrete_gaussian, exact_noise, rounded_gaussian
from capc.privacy import validation as check
from capc.privacy.randomness import SecureRandom

#: Grid points per vote on which LNMax adds its discrete Laplace noise.
LAPLACE_RESOLUTION = 256

#: Label value for a query the mechanism declined to answer.
NOT_ANSWERED = -1

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class ConfidentResult:
    """Output of Confident-GNMax for a batch of queries.

    ``labels``: shape (queries,), the noisy label or ``NOT_ANSWERED``.
    ``answered``: shape (queries,), what the guardian may learn.
    """

    labels: IntArray
    answered: NDArray[np.bool_]


def teacher_labels(labels: ArrayLike, num_classes: int) -> NDArray[np.int64]:
    """Check teacher predictions: integer classes in [0, num_classes), shape (queries, teachers)."""
    lab = np.asarray(labels)
    if lab.ndim != 2 or not np.issubdtype(lab.dtype, np.integer):
        raise ValueError(
            f"labels must be integer class indices of shape (queries, teachers), got {lab.dtype} {lab.shape}"
        )
    if ((lab < 0) | (lab >= num_classes)).any():
        raise ValueError(f"labels must lie in [0, {num_classes}); found {lab.min()}..{lab.max()}")
    return lab.astype(np.int64)


def accumulate_votes(lab: NDArray[np.int64], values: FloatArray, num_classes: int) -> FloatArray:
    """Add values[b, i] to hist[b, lab[b, i]] for every query b and teacher i: -> (queries, classes)."""
    hist = np.zeros((lab.shape[0], num_classes), dtype=np.float64)
    rows = np.repeat(np.arange(lab.shape[0]), lab.shape[1])
    np.add.at(hist, (rows, lab.ravel()), np.asarray(values, dtype=np.float64).ravel())
    return hist


def vote_histogram(labels: ArrayLike, num_classes: int) -> FloatArray:
    """Plain vote counts: (queries, teachers) class indices -> (queries, classes)."""
    lab = teacher_labels(labels, num_classes)
    return accumulate_votes(lab, np.ones(lab.shape), num_classes)


def gaussian_noise(
    shape: tuple[int, ...], sigma: float, rng: SecureRandom, discrete: bool = False
) -> FloatArray:
    """Noise N(0, sigma**2) per entry (votes), exactly, rounded to multiples of 2^-24
    (module docstring); ``discrete`` draws the integer discrete Gaussian instead."""
    sd = check.positive(sigma, "sigma")
    if discrete:
        return discrete_gaussian.noise(shape, sd, rng).astype(np.float64)
    return rounded_gaussian.noise(shape, sd, rng)


def _noise_like(hist: FloatArray, noise: ArrayLike, name: str) -> FloatArray:
    n = np.asarray(noise, dtype=np.float64)
    if n.shape != hist.shape:
        raise ValueError(f"{name} must have the histograms' shape {hist.shape}, got {n.shape}")
    if not np.isfinite(n).all():
        raise ValueError(f"{name} must be finite")
    return n


def noisy_argmax(histograms: ArrayLike, noise: ArrayLike) -> IntArray:
    """argmax(h + noise) per query; shapes (queries, classes) -> (queries,)."""
    h = check.histograms(histograms)
    return np.asarray(np.argmax(h + _noise_like(h, noise, "noise"), axis=1), dtype=np.int64)


def gnmax(
    histograms: ArrayLike, sigma: float, rng: SecureRandom, discrete: bool = False
) -> IntArray:
    """GNMax: argmax of the histogram plus N(0, sigma**2) on every count."""
    h = check.histograms(histograms)
    return noisy_argmax(h, gaussian_noise(h.shape, sigma, rng, discrete))


def confident_decide(
    histograms: ArrayLike, threshold: float, eta1: ArrayLike, eta2: ArrayLike
) -> ConfidentResult:
    """Confident-GNMax with explicit noise.

    Query b is answered iff max(h[b]) + eta1[b] >= threshold; an answered query
    gets argmax(h[b] + eta2[b]). Shapes: eta1 (queries,), eta2 (queries, classes).
    """
    h = check.histograms(histograms)
    t = check.non_negative(threshold, "threshold")
    e1 = np.asarray(eta1, dtype=np.float64)
    if e1.shape != (h.shape[0],):
        raise ValueError(f"eta1 must have shape ({h.shape[0]},), got {e1.shape}")
    answered = h.max(axis=1) + e1 >= t
    labels = np.where(answered, noisy_argmax(h, eta2), NOT_ANSWERED).astype(np.int64)
    return ConfidentResult(labels=labels, answered=answered)


def confident_gnmax(
    histograms: ArrayLike,
    threshold: float,
    sigma1: float,
    sigma2: float,
    rng: SecureRandom,
    discrete: bool = False,
) -> ConfidentResult:
    """Confident-GNMax (Papernot et al. 2018): a noisy threshold test, then GNMax."""
    h = check.histograms(histograms)
    eta1 = gaussian_noise((h.shape[0],), sigma1, rng, discrete)
    eta2 = gaussian_noise(h.shape, sigma2, rng, discrete)
    return confident_decide(h, threshold, eta1, eta2)


def laplace_noisy_max(histograms: ArrayLike, scale: float, rng: SecureRandom) -> IntArray:
    """LNMax (Papernot et al. 2017): argmax of the counts plus Laplace noise of ``scale``
    (votes), released exactly as pure (2 / scale)-DP.

    The counts go on a grid of s = ``LAPLACE_RESOLUTION`` points per vote, rounded down
    (k = floor(s h)), and get independent exact discrete Laplace noise of integer scale
    t = ceil(s * scale) grid points (:mod:`capc.privacy.exact_noise`). A vote of weight
    at most 1 moves two counts by at most s points each, so the noisy vector k + Z is
    already (2 s / t)-DP, and (2 s / t) <= 2 / scale; the argmax is post-processing (ties
    to the lowest class). A float Laplace sampler has no such guarantee: its outputs are
    bounded (about 37.4 scales) and sparse."""
    h = check.histograms(histograms)
    b = check.positive(scale, "scale")
    s = LAPLACE_RESOLUTION
    k = np.floor(h * s)
    t = math.ceil(b * s)
    if np.abs(k).max(initial=0) + 64 * t > 2**62:
        raise ValueError(f"counts up to {np.abs(h).max()} at scale {b} overflow the integer grid")
    z = exact_noise.discrete_laplace(t, h.shape, rng)
    return np.asarray(np.argmax(k.astype(np.int64) + z, axis=1), dtype=np.int64)
