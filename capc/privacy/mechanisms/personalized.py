"""Personalized budgets (Boenisch et al., "Individualized PATE", PETS 2023).

Teachers whose data owners accept a larger epsilon may contribute more:
- weighting: teacher i's vote counts w_i times, and is charged w_i**2 times
  the unweighted RDP (its L2 sensitivity is sqrt(2) * w_i);
- vanishing: teacher i votes on each query with probability p_i, chosen by the
  guardian independently of the data, and is charged only for queries it voted on;
- upsampling (central mode): a point with a larger budget is given to u
  teachers, which multiplies its RDP by u**2.

Teacher labels have shape (queries, teachers) with class indices.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.privacy import rdp
from capc.privacy.conversion import DEFAULT_ORDERS, Conversion
from capc.privacy.mechanisms.single_label import accumulate_votes, teacher_labels
from capc.privacy.planning import max_multiplier
from capc.privacy.randomness import SecureRandom

FloatArray = NDArray[np.float64]


def weighted_histogram(labels: ArrayLike, weights: ArrayLike, num_classes: int) -> FloatArray:
    """Histogram of weighted votes: (queries, teachers) labels, (teachers,) weights -> (queries, classes)."""
    lab = teacher_labels(labels, num_classes)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (lab.shape[1],):
        raise ValueError(f"weights must have shape ({lab.shape[1]},), got {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights must be finite and non-negative")
    return accumulate_votes(lab, np.broadcast_to(w, lab.shape), num_classes)


def sample_participation(
    participation: ArrayLike, queries: int, rng: SecureRandom
) -> NDArray[np.bool_]:
    """Who votes on which query: (teachers,) probabilities -> (queries, teachers) mask."""
    p = np.asarray(participation, dtype=np.float64)
    if p.ndim != 1 or not np.isfinite(p).all() or ((p < 0) | (p > 1)).any():
        raise ValueError("participation must be a 1-D array of probabilities in [0, 1]")
    return rng.uniform((queries, p.size)) < p


def participating_histogram(labels: ArrayLike, mask: ArrayLike, num_classes: int) -> FloatArray:
    """Histogram of the votes of participating teachers only (vanishing)."""
    lab = teacher_labels(labels, num_classes)
    m = np.asarray(mask, dtype=bool)
    if m.shape != lab.shape:
        raise ValueError(f"mask must have the labels' shape {lab.shape}, got {m.shape}")
    return accumulate_votes(lab, m.astype(np.float64), num_classes)


def weights_for_caps(
    caps: ArrayLike,
    delta: float,
    sigma: float,
    queries: int,
    orders: ArrayLike = DEFAULT_ORDERS,
    conversion: Conversion = Conversion.IMPROVED,
) -> FloatArray:
    """Vote weights under which every teacher reaches its cap after the same ``queries``.

    ``caps``: (teachers,) epsilon caps at ``delta``. Teacher i's GNMax RDP is
    w_i**2 * orders / sigma**2, so w_i = sqrt(the largest multiplier that fits
    its cap). Returns (teachers,) weights; a teacher whose cap cannot cover even
    an infinitesimal share gets weight 0.
    """
    unit = rdp.gnmax_data_independent(sigma, orders)
    return np.sqrt(_multipliers(caps, "caps", delta, unit, queries, orders, conversion))


def vote_weights(
    caps: ArrayLike,
    unit_rdp: ArrayLike,
    orders: ArrayLike,
    queries: int,
    delta: float,
    max_weight: float = np.inf,
) -> FloatArray:
    """Weighting: (teachers,) eps caps at ``delta`` -> (teachers,) vote weights with mean 1.

    ``unit_rdp``: one query's RDP at weight 1 (any mechanism; weights scale it
    by w**2). Weights are proportional to the square root of what each cap
    affords, so every teacher reaches its cap after the same number of
    queries, and normalised to mean 1 so the histogram keeps its scale (the
    noise and thresholds of the task stay meaningful); then capped at
    ``max_weight``, which only slows a teacher's spending.
    """
    unit = np.asarray(unit_rdp, dtype=np.float64)
    mult = _multipliers(caps, "caps", delta, unit, queries, orders, Conversion.IMPROVED)
    return weights_from_multipliers(mult, max_weight)


def weights_from_multipliers(multipliers: ArrayLike, max_weight: float = np.inf) -> FloatArray:
    """(teachers,) cost multipliers each cap affords -> vote weights with mean 1, capped.

    A weight w multiplies a Gaussian mechanism's cost (mu**2, or RDP) by w**2,
    so w is proportional to the square root of the multiplier.
    """
    root = np.sqrt(np.asarray(multipliers, dtype=np.float64))
    if not root.any():
        return np.zeros_like(root)
    return np.asarray(np.minimum(root / root.mean(), max_weight), dtype=np.float64)


def participation_rates(
    caps: ArrayLike, unit_rdp: ArrayLike, orders: ArrayLike, queries: int, delta: float
) -> FloatArray:
    """Vanishing: (teachers,) eps caps -> (teachers,) probabilities of voting on a query.

    Proportional to what each cap affords, the largest at 1, so every teacher
    is expected to reach its cap after the same number of queries.
    """
    unit = np.asarray(unit_rdp, dtype=np.float64)
    return rates_from_multipliers(
        _multipliers(caps, "caps", delta, unit, queries, orders, Conversion.IMPROVED)
    )


def rates_from_multipliers(multipliers: ArrayLike) -> FloatArray:
    """(teachers,) cost multipliers each cap affords -> participation rates, the largest 1."""
    mult = np.asarray(multipliers, dtype=np.float64)
    top = float(mult.max())
    return mult / top if top > 0 else np.zeros_like(mult)


def upsampling_replicas(
    point_caps: ArrayLike,
    delta: float,
    sigma: float,
    queries: int,
    max_replicas: int,
    orders: ArrayLike = DEFAULT_ORDERS,
    conversion: Conversion = Conversion.IMPROVED,
) -> NDArray[np.int64]:
    """How many teachers may train on each point (upsampling): the largest u whose
    u**2-scaled GNMax cost over ``queries`` queries fits the point's cap, at most
    ``max_replicas``; 0 where even one replica does not fit. (points,) -> (points,).
    """
    if max_replicas < 1:
        raise ValueError(f"max_replicas must be >= 1, got {max_replicas}")
    unit = rdp.gnmax_data_independent(sigma, orders)
    mult = _multipliers(point_caps, "point_caps", delta, unit, queries, orders, conversion)
    # Floor of sqrt with a tiny tolerance so an exact square is not lost to rounding.
    u = np.floor(np.sqrt(mult) + 1e-12).astype(np.int64)
    return np.asarray(np.minimum(u, max_replicas), dtype=np.int64)


def _multipliers(
    caps: ArrayLike,
    name: str,
    delta: float,
    unit: ArrayLike,
    queries: int,
    orders: ArrayLike,
    conversion: Conversion,
) -> FloatArray:
    """Per cap, the largest multiple of the per-query RDP ``unit`` that ``queries`` queries afford."""
    c = np.asarray(caps, dtype=np.float64)
    if c.ndim != 1 or not np.isfinite(c).all() or (c <= 0).any():
        raise ValueError(f"{name} must be a 1-D array of positive epsilons")
    return np.array([max_multiplier(unit, orders, queries, float(e), delta, conversion) for e in c])


def assign_upsampled(
    replicas: ArrayLike, num_teachers: int, rng: SecureRandom
) -> list[NDArray[np.int64]]:
    """For each point, the distinct teachers that train on it (u_p of them, chosen uniformly)."""
    u = np.asarray(replicas, dtype=np.int64)
    if (u < 0).any() or (u > num_teachers).any():
        raise ValueError(f"replicas must lie in [0, {num_teachers}]")
    keys = rng.uniform((u.size, num_teachers))
    order = np.argsort(keys, axis=1)
    return [order[i, : u[i]] for i in range(u.size)]
