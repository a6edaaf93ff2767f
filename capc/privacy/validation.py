"""Argument checks shared by the privacy library.

Every check raises ``ValueError`` that names the offending argument and value,
so a caller several layers up can tell the user what to fix.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray


def positive(value: float, name: str) -> float:
    """Return ``value`` as a float after checking it is finite and > 0."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not math.isfinite(x) or x <= 0.0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return x


def non_negative(value: float, name: str) -> float:
    """Return ``value`` as a float after checking it is finite and >= 0."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a non-negative number, got {value!r}") from None
    if not math.isfinite(x) or x < 0.0:
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return x


def delta(value: float) -> float:
    """Check a DP delta: a number strictly between 0 and 1."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"delta must be a number in (0, 1), got {value!r}") from None
    if not 0.0 < x < 1.0:
        raise ValueError(f"delta must lie strictly between 0 and 1, got {value!r}")
    return x


def probability(value: float, name: str) -> float:
    """Check a probability in [0, 1]."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}") from None
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    return x


def orders(values: ArrayLike) -> NDArray[np.float64]:
    """Check Renyi orders: a non-empty 1-D array of finite numbers > 1."""
    arr = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"orders must be a non-empty 1-D sequence, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr <= 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"Renyi orders must be finite and > 1; orders[{i}] = {arr[i]!r}")
    return arr


def _first_bad(arr: NDArray[np.float64]) -> tuple[tuple[int, ...], float] | None:
    bad = ~np.isfinite(arr) | (arr < 0)
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    return idx, float(arr[idx])


def votes(values: ArrayLike, name: str = "votes") -> NDArray[np.float64]:
    """Check one vote histogram: 1-D, at least 2 classes, finite and >= 0."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D histogram over classes, got shape {arr.shape}")
    if arr.size < 2:
        raise ValueError(f"{name} needs at least 2 classes, got {arr.size}")
    bad = _first_bad(arr)
    if bad is not None:
        raise ValueError(
            f"{name} must be finite and non-negative; {name}{list(bad[0])} = {bad[1]!r}"
        )
    return arr


def histograms(values: ArrayLike, name: str = "histograms") -> NDArray[np.float64]:
    """Check a batch of vote histograms of shape (queries, classes).

    A 1-D histogram is taken as a batch of one query.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{name} must have shape (queries, classes), got shape {arr.shape}")
    if arr.shape[1] < 2:
        raise ValueError(f"{name} needs at least 2 classes, got shape {arr.shape}")
    bad = _first_bad(arr)
    if bad is not None:
        raise ValueError(
            f"{name} must be finite and non-negative; {name}{list(bad[0])} = {bad[1]!r}"
        )
    return arr


def same_length(a: NDArray[np.float64], b: NDArray[np.float64], what: str) -> None:
    """Check two per-order arrays line up."""
    if a.shape != b.shape:
        raise ValueError(f"{what}: shapes differ, {a.shape} vs {b.shape}")
