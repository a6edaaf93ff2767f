"""Multi-label aggregation over k labels: Binary, tau and Powerset voting.

Teachers' votes have shape (queries, teachers, k): k-hot vectors, or scores in
[0, 1]. Aggregated counts have shape (queries, k). Released labels have shape
(queries, k) with values 1, 0, or ``NOT_ANSWERED`` (-1) where a per-label
confidence test failed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.mpc.validity import max_width
from capc.privacy import validation as check
from capc.privacy.mechanisms.single_label import NOT_ANSWERED, gaussian_noise, noisy_argmax
from capc.privacy.randomness import SecureRandom

#: Labels Powerset voting takes, in every path (plain, secure, advisor): the most k whose
#: 2**k subset counts a party's vote-validity statement covers at one teacher
#: (:func:`capc.mpc.validity.max_width`: 2**9 of the 512 elements per query). Without a
#: statement a hospital could skew the subset counts within the circuit's range checks and
#: decide labels, so larger k is refused rather than run unchecked (9 today; the circuit's
#: cost, 5.4 MB a query garbled at 2**10 subsets, would stop it near 10 anyway).
MAX_POWERSET_LABELS = max_width(1).bit_length() - 1

FloatArray = NDArray[np.float64]
LabelArray = NDArray[np.int8]


@dataclass(frozen=True)
class Confidence:
    """Per-label confidence test: answer label j iff |c_j - theta_j| + N(0, sigma1**2) >= threshold_j."""

    threshold: FloatArray | float
    sigma1: float


def _votes(votes: ArrayLike) -> FloatArray:
    v = np.asarray(votes, dtype=np.float64)
    if v.ndim != 3:
        raise ValueError(f"votes must have shape (queries, teachers, labels), got {v.shape}")
    if not np.isfinite(v).all() or (v < 0).any() or (v > 1).any():
        raise ValueError("votes must be finite scores in [0, 1] (k-hot vectors or probabilities)")
    return v


def binary_counts(votes: ArrayLike) -> FloatArray:
    """Per-label positive counts: (queries, teachers, k) -> (queries, k)."""
    return np.asarray(_votes(votes).sum(axis=1), dtype=np.float64)


def clip_votes(votes: ArrayLike, tau: float) -> FloatArray:
    """Scale each teacher's vote vector down to L2 norm at most ``tau``; same shape."""
    v = _votes(votes)
    t = check.positive(tau, "tau")
    norms = np.linalg.norm(v, axis=2, keepdims=True)
    # All-zero votes have norm 0 and need no scaling.
    scale = np.minimum(1.0, np.divide(t, norms, out=np.ones_like(norms), where=norms > 0))
    return np.asarray(v * scale, dtype=np.float64)


def tau_counts(votes: ArrayLike, tau: float) -> FloatArray:
    """Per-label sums of tau-clipped votes: (queries, teachers, k) -> (queries, k)."""
    return np.asarray(clip_votes(votes, tau).sum(axis=1), dtype=np.float64)


def _per_label(value: ArrayLike, k: int, name: str) -> FloatArray:
    arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (k,)).copy()
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite")
    return arr


def multilabel_decide(
    counts: ArrayLike,
    decision_threshold: ArrayLike,
    noise: ArrayLike,
    confidence_threshold: ArrayLike | None = None,
    confidence_noise: ArrayLike | None = None,
) -> LabelArray:
    """Per-label decisions with explicit noise.

    Label j of query b is 1 iff counts[b, j] + noise[b, j] >= decision_threshold[j].
    With a confidence test, it is released only if
    |counts[b, j] - decision_threshold[j]| + confidence_noise[b, j] >= confidence_threshold[j].
    """
    if np.ndim(counts) != 2:
        raise ValueError(f"counts must have shape (queries, labels), got {np.shape(counts)}")
    c = check.histograms(counts, "counts")
    k = c.shape[1]
    theta = _per_label(decision_threshold, k, "decision_threshold")
    n = np.asarray(noise, dtype=np.float64)
    if n.shape != c.shape:
        raise ValueError(f"noise must have shape {c.shape}, got {n.shape}")
    labels = (c + n >= theta).astype(np.int8)
    if confidence_threshold is None:
        return labels
    if confidence_noise is None:
        raise ValueError("a confidence test needs confidence_noise")
    t = _per_label(confidence_threshold, k, "confidence_threshold")
    n1 = np.asarray(confidence_noise, dtype=np.float64)
    if n1.shape != c.shape:
        raise ValueError(f"confidence_noise must have shape {c.shape}, got {n1.shape}")
    answered = np.abs(c - theta) + n1 >= t
    return np.where(answered, labels, np.int8(NOT_ANSWERED)).astype(np.int8)


def _vote_on_counts(
    counts: FloatArray,
    decision_threshold: ArrayLike,
    sigma: float,
    rng: SecureRandom,
    confidence: Confidence | None,
) -> LabelArray:
    noise = gaussian_noise(counts.shape, sigma, rng)
    if confidence is None:
        return multilabel_decide(counts, decision_threshold, noise)
    noise1 = gaussian_noise(counts.shape, confidence.sigma1, rng)
    return multilabel_decide(counts, decision_threshold, noise, confidence.threshold, noise1)


def binary_voting(
    counts: ArrayLike,
    num_teachers: int,
    sigma: float,
    rng: SecureRandom,
    confidence: Confidence | None = None,
) -> LabelArray:
    """Binary voting: label j is positive iff its noisy count reaches half the teachers.

    ``counts``: (queries, k) positive-vote counts from :func:`binary_counts`.
    """
    c = np.asarray(check.histograms(counts, "counts"))
    if num_teachers < 1:
        raise ValueError(f"num_teachers must be >= 1, got {num_teachers}")
    return _vote_on_counts(c, num_teachers / 2.0, sigma, rng, confidence)


def tau_voting(
    counts: ArrayLike,
    num_teachers: int,
    sigma: float,
    rng: SecureRandom,
    confidence: Confidence | None = None,
) -> LabelArray:
    """tau voting: Binary voting on sums of tau-clipped votes (from :func:`tau_counts`).

    The clipping bounds each teacher's influence by tau in L2, so the noise
    needed no longer grows with sqrt(k) once tau < sqrt(k / 2). The decision is
    the same per-label majority; only the counts (and the charge) differ.
    """
    return binary_voting(counts, num_teachers, sigma, rng, confidence)


def powerset_histogram(votes: ArrayLike) -> FloatArray:
    """Histogram over the 2**k label subsets: (queries, teachers, k) k-hot -> (queries, 2**k).

    Subset index = sum_j bit_j * 2**j.
    """
    v = _votes(votes)
    k = v.shape[2]
    if k > MAX_POWERSET_LABELS:
        raise ValueError(
            f"Powerset voting supports at most {MAX_POWERSET_LABELS} labels (a vote-validity "
            f"statement covers at most 2**{MAX_POWERSET_LABELS} subsets), got {k}: split the "
            "labels into tasks of at most that many"
        )
    if not np.isin(v, (0.0, 1.0)).all():
        raise ValueError("Powerset voting needs k-hot votes (entries 0 or 1)")
    index = (v.astype(np.int64) << np.arange(k, dtype=np.int64)).sum(axis=2)
    queries = v.shape[0]
    hist = np.zeros((queries, 1 << k), dtype=np.float64)
    np.add.at(hist, (np.repeat(np.arange(queries), v.shape[1]), index.ravel()), 1.0)
    return hist


def subset_bits(index: ArrayLike, num_labels: int) -> LabelArray:
    """Decode subset indices (queries,) into k-bit label vectors (queries, k)."""
    idx = np.asarray(index, dtype=np.int64)
    return ((idx[:, None] >> np.arange(num_labels, dtype=np.int64)) & 1).astype(np.int8)


def powerset_decide(histogram: ArrayLike, noise: ArrayLike, num_labels: int) -> LabelArray:
    """Powerset voting with explicit noise: noisy argmax over subsets, decoded to bits."""
    return subset_bits(noisy_argmax(histogram, noise), num_labels)


def powerset_voting(
    histogram: ArrayLike, num_labels: int, sigma: float, rng: SecureRandom
) -> LabelArray:
    """Powerset voting: GNMax over the 2**k subsets of :func:`powerset_histogram`."""
    h = check.histograms(histogram)
    if h.shape[1] != 1 << num_labels:
        raise ValueError(
            f"a powerset histogram over {num_labels} labels has {1 << num_labels} columns, got {h.shape[1]}"
        )
    return powerset_decide(h, gaussian_noise(h.shape, sigma, rng), num_labels)
