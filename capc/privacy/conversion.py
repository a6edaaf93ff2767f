"""From Renyi DP to (epsilon, delta)-DP, minimised over a grid of orders.

Units: RDP and epsilon in nats; orders are Renyi orders alpha > 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.privacy import validation as check

FloatArray = NDArray[np.float64]

#: Default order grid: 2, 2.5, ..., 99.5 and 200 log-spaced orders from 100 to
#: 1000. Fine steps where the optimum usually lies (small epsilon sits at
#: large orders, large epsilon at small ones), sparse ones in the far tail.
DEFAULT_ORDERS: FloatArray = np.concatenate(
    (np.arange(2.0, 100.0, 0.5), np.logspace(np.log10(100.0), np.log10(1000.0), 200))
)

#: The grid of the original PATE analysis: 2, 2.5, ..., 100 and 100
#: log-spaced orders from 100 to 500; used with the basic conversion.
PATE_ORDERS: FloatArray = np.concatenate(
    (np.arange(2.0, 100.5, 0.5), np.logspace(np.log10(100.0), np.log10(500.0), 100))
)


class Conversion(StrEnum):
    """How RDP is turned into (epsilon, delta)."""

    #: Mironov 2017, Prop. 3: eps = rdp + log(1/delta) / (order - 1).
    BASIC = "basic"
    #: Balle et al. 2020, Thm. 21: eps = rdp + log(1 - 1/order) - log(delta * order) / (order - 1).
    IMPROVED = "improved"


@dataclass(frozen=True)
class Epsilon:
    """An (epsilon, delta) guarantee and how it was obtained."""

    epsilon: float
    delta: float
    order: float
    conversion: Conversion
    #: True when the total-variation shortcut gave epsilon = 0.
    tv_shortcut: bool = False


def _per_order(
    rdp: FloatArray, orders: FloatArray, delta: float, conversion: Conversion
) -> FloatArray:
    with np.errstate(over="ignore", invalid="ignore"):
        if conversion is Conversion.BASIC:
            return rdp - math.log(delta) / (orders - 1.0)
        return rdp + np.log1p(-1.0 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1.0)


def _check_rdp(rdp: ArrayLike, orders: ArrayLike) -> tuple[FloatArray, FloatArray]:
    o = check.orders(orders)
    r = np.atleast_1d(np.asarray(rdp, dtype=np.float64))
    check.same_length(r, o, "rdp and orders")
    bad = np.isnan(r) | (r < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"RDP must be non-negative and not NaN; rdp[{i}] = {r[i]!r}")
    return r, o


def convert(
    rdp: ArrayLike,
    orders: ArrayLike,
    delta: float,
    conversion: Conversion = Conversion.IMPROVED,
    tv_shortcut: bool = False,
) -> Epsilon:
    """The smallest epsilon over ``orders`` for total RDP ``rdp`` at ``delta``.

    ``rdp`` and ``orders`` are 1-D arrays of equal length. With ``tv_shortcut``,
    an order whose RDP satisfies sqrt(1 - exp(-rdp)) <= delta yields (0, delta)-DP
    (Renyi divergence grows with the order, so the KL divergence is at most that
    RDP, and Pinsker bounds the total variation).
    """
    r, o = _check_rdp(rdp, orders)
    d = check.delta(delta)
    if tv_shortcut:
        tv_ok = d * d + np.expm1(-r) >= 0.0
        if tv_ok.any():
            i = int(np.flatnonzero(tv_ok)[0])
            return Epsilon(0.0, d, float(o[i]), conversion, tv_shortcut=True)
    eps = _per_order(r, o, d, conversion)
    i = int(np.argmin(eps))
    return Epsilon(max(0.0, float(eps[i])), d, float(o[i]), conversion)


def epsilon(rdp: ArrayLike, orders: ArrayLike, delta: float) -> tuple[float, float]:
    """(epsilon, best order) by the improved conversion of Balle et al. 2020 (Thm. 21).

    ``rdp``: total RDP at each order (nats), shape (n,); ``orders``: shape (n,),
    each > 1; ``delta`` in (0, 1).
    """
    e = convert(rdp, orders, delta, Conversion.IMPROVED)
    return e.epsilon, e.order


def epsilon_basic(rdp: ArrayLike, orders: ArrayLike, delta: float) -> tuple[float, float]:
    """(epsilon, best order) by the basic conversion eps = rdp + log(1/delta)/(order - 1)."""
    e = convert(rdp, orders, delta, Conversion.BASIC)
    return e.epsilon, e.order


def conversion_offset(orders: ArrayLike, delta: float, conversion: Conversion) -> FloatArray:
    """The part of epsilon that does not depend on the RDP, at each order.

    epsilon(order) = rdp(order) + offset(order); planning solves against it.
    """
    o = check.orders(orders)
    return _per_order(np.zeros_like(o), o, check.delta(delta), conversion)
