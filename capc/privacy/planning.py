"""Planning: how many queries fit a budget, and what noise a plan needs.

All solutions are exact on the order grid: epsilon after n queries is
min over orders of n * rdp(order) + offset(order) (see
:func:`capc.privacy.conversion.conversion_offset`), so n fits iff some order has
n * rdp(order) <= epsilon - offset(order).
"""

from __future__ import annotations

import math
import sys

import numpy as np
from numpy.typing import ArrayLike

from capc.privacy import validation as check
from capc.privacy.conversion import Conversion, Epsilon, conversion_offset, convert

#: Returned by :func:`max_queries` when queries cost nothing at some order.
UNLIMITED = sys.maxsize


def _rdp(per_query_rdp: ArrayLike, orders: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    o = check.orders(orders)
    r = np.atleast_1d(np.asarray(per_query_rdp, dtype=np.float64))
    check.same_length(r, o, "per_query_rdp and orders")
    if np.isnan(r).any() or (r < 0).any():
        raise ValueError("per-query RDP must be non-negative and not NaN")
    return r, o


def epsilon_after(
    per_query_rdp: ArrayLike,
    orders: ArrayLike,
    queries: int,
    delta: float,
    conversion: Conversion = Conversion.IMPROVED,
) -> Epsilon:
    """(epsilon, delta) after ``queries`` identical queries of the given per-query RDP."""
    r, o = _rdp(per_query_rdp, orders)
    if queries < 0:
        raise ValueError(f"queries must be >= 0, got {queries}")
    return convert(queries * r, o, delta, conversion)


def max_queries(
    per_query_rdp: ArrayLike,
    orders: ArrayLike,
    epsilon: float,
    delta: float,
    conversion: Conversion = Conversion.IMPROVED,
    spent_rdp: ArrayLike | None = None,
) -> int:
    """The largest number of identical queries whose composition stays within (epsilon, delta).

    ``spent_rdp`` (one value per order, nats): what was composed already, so
    the answer is how many more queries fit (a party's projected exhaustion).
    Returns 0 if not even one fits and :data:`UNLIMITED` if a query costs
    nothing at an order whose offset already fits.
    """
    r, o = _rdp(per_query_rdp, orders)
    base = np.zeros_like(r) if spent_rdp is None else _rdp(spent_rdp, o)[0]
    eps = check.positive(epsilon, "epsilon")
    slack = eps - conversion_offset(o, delta, conversion) - base
    ok = slack >= 0
    if not ok.any():
        return 0
    if (ok & (r == 0)).any():
        return UNLIMITED
    with np.errstate(divide="ignore"):
        per_order = np.where(ok, np.floor(slack / np.where(r > 0, r, 1.0)), -1.0)
    n = int(per_order.max())
    # Guard the float floor against rounding on either side.
    while n > 0 and convert(base + n * r, o, delta, conversion).epsilon > eps:
        n -= 1
    while convert(base + (n + 1) * r, o, delta, conversion).epsilon <= eps:
        n += 1
    return n


def _unit_and_slack(
    unit_rdp: ArrayLike,
    orders: ArrayLike,
    queries: int,
    epsilon: float,
    delta: float,
    conversion: Conversion,
) -> tuple[np.ndarray, np.ndarray]:
    # The per-order budget left once the conversion's offset is paid.
    u, o = _rdp(unit_rdp, orders)
    if queries < 1:
        raise ValueError(f"queries must be >= 1, got {queries}")
    return u, check.positive(epsilon, "epsilon") - conversion_offset(o, delta, conversion)


def noise_scale_for(
    unit_rdp: ArrayLike,
    orders: ArrayLike,
    queries: int,
    epsilon: float,
    delta: float,
    conversion: Conversion = Conversion.IMPROVED,
) -> float:
    """The smallest noise scale s for which ``queries`` queries fit (epsilon, delta).

    ``unit_rdp`` is the per-query RDP at scale 1 of a mechanism whose RDP scales
    as 1 / s**2 (every Gaussian mechanism here; for Confident-GNMax scale both
    sigmas together). Solves queries * unit(order) / s**2 + offset(order) <= epsilon.
    """
    u, slack = _unit_and_slack(unit_rdp, orders, queries, epsilon, delta, conversion)
    ok = slack > 0
    if not ok.any():
        raise ValueError(
            f"epsilon={epsilon} is below what delta={delta} alone costs on this order grid; "
            "raise epsilon or delta"
        )
    need = np.where(ok, queries * u / np.where(ok, slack, 1.0), np.inf)
    return math.sqrt(float(need.min()))


def max_multiplier(
    unit_rdp: ArrayLike,
    orders: ArrayLike,
    queries: int,
    epsilon: float,
    delta: float,
    conversion: Conversion = Conversion.IMPROVED,
) -> float:
    """The largest m such that ``queries`` queries of RDP m * unit_rdp fit (epsilon, delta).

    Used for personalized budgets: a vote weight w multiplies a teacher's RDP by w**2.
    """
    u, slack = _unit_and_slack(unit_rdp, orders, queries, epsilon, delta, conversion)
    ok = (slack >= 0) & (u > 0)
    if not ok.any():
        return 0.0
    return float(np.max(np.where(ok, slack / (queries * np.where(u > 0, u, 1.0)), 0.0)))
