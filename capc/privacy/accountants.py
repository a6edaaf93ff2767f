"""Accountants: what a composition of privacy events costs, and whether more fits.

An accountant interprets :mod:`capc.privacy.events`. Both kinds here are
*additive*: each event maps to a loss vector, composition is a sum, and the
(epsilon, delta) guarantee is a function of the sum. That is what lets the
ledger keep one running vector per party, lock one row to check a budget and
replace a reservation by a charge with a subtraction.

- ``gdp`` (:class:`GaussianDp`): exact Gaussian DP (Dong, Roth and Su 2022).
  The vector is [sum of mu_i**2]. Supports Gaussian mechanisms only, and for
  a composition of them no accountant gives a smaller epsilon.
- ``rdp`` (:class:`RenyiDp`): Renyi DP on an order grid with the improved
  conversion (Balle et al. 2020). The vector is the RDP curve. Supports
  Gaussian, pure-DP and RDP-curve events.

Budgets under adaptive composition (a *privacy filter*): a ledger admits an
event only if the total, with the event, still fits the cap, and the events
may be chosen from earlier outputs (how many queries a round answered
decides what the next charge is). :meth:`Accounting.admissible` says which
events an accountant's filter is proven for:

- ``gdp``: every Gaussian event. Adaptively chosen mu_i with
  sum mu_i**2 <= mu**2 enforced before each step is mu-GDP (Smith and
  Thakurta 2022, "Fully adaptive composition for Gaussian differential
  privacy").
- ``rdp``: Gaussian events only. Their curves are linear in the order
  (order * mu**2 / 2), so "the order-minimised epsilon fits" is the same
  condition as "sum mu_i**2 fits" and reduces to a Renyi filter at one fixed
  order (Feldman and Zrnic 2021). For curves of other shapes the best order
  moves with the history and minimising over orders after the fact is not a
  proven filter, so such events are refused as filter charges (they can
  still be composed and reported).

Units: epsilon in nats; delta a probability; Renyi orders > 1.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.privacy import gaussian_dp, planning
from capc.privacy import validation as check
from capc.privacy.conversion import DEFAULT_ORDERS, Conversion, conversion_offset, convert
from capc.privacy.events import (
    DpEvent,
    GaussianEvent,
    NoOpEvent,
    PureDpEvent,
    RdpCurveEvent,
    leaves,
    rdp_curve,
)

FloatArray = NDArray[np.float64]


class UnsupportedEventError(ValueError):
    """The accountant cannot interpret this event (or not as a budget charge)."""


@dataclass(frozen=True)
class Spent:
    """An (epsilon, delta) guarantee and how the accountant reached it.

    ``order``: the best Renyi order (``rdp`` only); ``mu``: the composed
    Gaussian-DP mu (``gdp`` only).
    """

    epsilon: float
    delta: float
    accountant: str
    order: float | None = None
    mu: float | None = None


class Accounting(ABC):
    """One accountant kind: maps events to additive loss vectors and vectors to epsilon."""

    name: ClassVar[str]
    #: Which events it supports, for error messages.
    description: ClassVar[str]
    #: One line for people: what it is.
    summary: ClassVar[str]

    @abstractmethod
    def supports(self, event: DpEvent) -> bool:
        """True when :meth:`cost` can interpret ``event``."""

    @abstractmethod
    def admissible(self, event: DpEvent) -> bool:
        """True when ``event`` may be charged under this accountant's privacy filter."""

    @abstractmethod
    def _cost(self, event: DpEvent) -> FloatArray: ...

    @abstractmethod
    def spent(self, total: ArrayLike, delta: float) -> Spent:
        """The guarantee of a composition whose loss vector is ``total``."""

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """JSON-safe parameters that, with :attr:`name`, rebuild this accountant."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Length of a loss vector."""

    def zero(self) -> FloatArray:
        """The loss vector of nothing."""
        return np.zeros(self.size)

    def cost(self, event: DpEvent) -> FloatArray:
        """Loss vector of ``event``; raises UnsupportedEventError when not supported."""
        if not self.supports(event):
            raise UnsupportedEventError(
                f"the {self.name} accountant cannot interpret {_kinds(event)} events; "
                f"supported: {self.description}"
            )
        return self._cost(event)

    def filter_cost(self, event: DpEvent) -> FloatArray:
        """Loss vector of ``event`` as a budget charge; refuses events the filter is not proven for."""
        if not self.admissible(event):
            raise UnsupportedEventError(
                f"the {self.name} accountant's budget filter is proven only for Gaussian "
                f"mechanisms, not for {_kinds(event)} events; account them on their own "
                "or fix their number in advance"
            )
        return self.cost(event)

    def check_total(self, total: ArrayLike) -> FloatArray:
        """A stored loss vector, validated (shape, finite, non-negative)."""
        v = np.atleast_1d(np.asarray(total, dtype=np.float64))
        if v.shape != (self.size,):
            raise ValueError(
                f"a {self.name} loss vector has {self.size} entries, got shape {v.shape}"
            )
        if not np.isfinite(v).all() or (v < 0).any():
            raise ValueError(f"a {self.name} loss vector must be finite and non-negative")
        return v

    def fits(self, total: ArrayLike, epsilon: float, delta: float) -> bool:
        """True when a composition with loss ``total`` is (epsilon, delta)-DP."""
        return self.spent(total, delta).epsilon <= epsilon

    def max_count(
        self, event: DpEvent, epsilon: float, delta: float, spent: ArrayLike | None = None
    ) -> int:
        """How many more copies of ``event`` fit (epsilon, delta) after ``spent`` (a loss vector)."""
        return self.max_count_of(self.filter_cost(event), epsilon, delta, spent)

    def max_count_of(
        self, unit: ArrayLike, epsilon: float, delta: float, spent: ArrayLike | None = None
    ) -> int:
        """How many more copies of a loss vector ``unit`` (one query's, in this accountant)
        fit (epsilon, delta) after ``spent``: :meth:`max_count` for a cost already computed."""
        u = self.check_total(unit)
        base = self.zero() if spent is None else self.check_total(spent)
        if not u.any():
            raise ValueError("a free event fits any budget: nothing to count")
        return self._max_count(u, base, check.positive(epsilon, "epsilon"), check.delta(delta))

    def max_multiplier(self, event: DpEvent, count: int, epsilon: float, delta: float) -> float:
        """The largest m such that ``count`` copies of ``event`` with m times its loss fit
        (epsilon, delta). A vote weight w multiplies a Gaussian mechanism's loss by w**2."""
        unit = self.filter_cost(event)
        if count < 1 or not unit.any():
            raise ValueError("max_multiplier needs count >= 1 and an event that costs something")
        eps, d = check.positive(epsilon, "epsilon"), check.delta(delta)
        return self._max_multiplier(count * unit, eps, d)

    def _max_multiplier(self, unit: FloatArray, epsilon: float, delta: float) -> float:
        lo, hi = 0.0, 1.0
        while self.fits(hi * unit, epsilon, delta):
            lo, hi = hi, 2.0 * hi
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if mid in (lo, hi):
                break
            if self.fits(mid * unit, epsilon, delta):
                lo = mid
            else:
                hi = mid
        return lo

    def _max_count(self, unit: FloatArray, base: FloatArray, epsilon: float, delta: float) -> int:
        # Exponential then binary search on n: fits(base + n unit) is monotone in n.
        if not self.fits(base + unit, epsilon, delta):
            return 0
        lo, hi = 1, 2
        while self.fits(base + hi * unit, epsilon, delta):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fits(base + mid * unit, epsilon, delta):
                lo = mid
            else:
                hi = mid
        return lo


def _kinds(event: DpEvent) -> str:
    return "/".join(sorted({leaf.kind for leaf, _ in leaves(event)}))


class GaussianDp(Accounting):
    """Exact Gaussian-DP accounting; the loss vector is [sum mu_i**2]."""

    name = "gdp"
    description = "Gaussian mechanisms (composed exactly as Gaussian DP)"
    summary = "exact Gaussian DP (Dong, Roth and Su 2022)"

    @property
    def size(self) -> int:
        return 1

    def supports(self, event: DpEvent) -> bool:
        return all(isinstance(leaf, GaussianEvent | NoOpEvent) for leaf, _ in leaves(event))

    def admissible(self, event: DpEvent) -> bool:
        return self.supports(event)

    def _cost(self, event: DpEvent) -> FloatArray:
        # Counts of equal mechanisms are summed before squaring, so k copies cost exactly
        # what one event of count k costs (a worst case is never below its actual charge).
        counts: dict[float, int] = {}
        for leaf, n in leaves(event):
            if isinstance(leaf, GaussianEvent):
                counts[leaf.mu] = counts.get(leaf.mu, 0) + n
        # mu * mu, not mu ** 2: a huge mu gives infinity (refused downstream), not OverflowError.
        return np.array([math.fsum(n * (mu * mu) for mu, n in counts.items())])

    def spent(self, total: ArrayLike, delta: float) -> Spent:
        mu = math.sqrt(float(self.check_total(total)[0]))
        return Spent(gaussian_dp.epsilon_at(mu, delta), check.delta(delta), self.name, mu=mu)

    def fits(self, total: ArrayLike, epsilon: float, delta: float) -> bool:
        mu = math.sqrt(float(self.check_total(total)[0]))
        return gaussian_dp.within(mu, epsilon, delta)

    def _max_count(self, unit: FloatArray, base: FloatArray, epsilon: float, delta: float) -> int:
        return gaussian_dp.max_queries_gdp(
            math.sqrt(float(unit[0])), epsilon, delta, math.sqrt(float(base[0]))
        )

    def _max_multiplier(self, unit: FloatArray, epsilon: float, delta: float) -> float:
        # The square and the division round, and a caller may multiply in another order:
        # keep a relative margin of 1e-12, then step down until the product really fits.
        m = gaussian_dp.max_mu(epsilon, delta) ** 2 / float(unit[0]) * (1.0 - 1e-12)
        while m > 0 and not self.fits(m * unit, epsilon, delta):
            m = float(np.nextafter(m, 0.0))
        return m

    def settings(self) -> dict[str, Any]:
        return {}


class RenyiDp(Accounting):
    """Renyi-DP accounting on ``orders``; the loss vector is the RDP curve (nats per order)."""

    name = "rdp"
    description = "Gaussian, pure-DP and RDP-curve events on its order grid"
    summary = "Renyi DP, improved conversion (Balle et al. 2020)"

    def __init__(
        self, orders: ArrayLike = DEFAULT_ORDERS, conversion: Conversion = Conversion.IMPROVED
    ) -> None:
        self.orders = check.orders(orders)
        self.conversion = Conversion(conversion)

    @property
    def size(self) -> int:
        return int(self.orders.size)

    def supports(self, event: DpEvent) -> bool:
        for leaf, _ in leaves(event):
            if isinstance(leaf, RdpCurveEvent) and not np.array_equal(leaf.orders, self.orders):
                return False
            if not isinstance(leaf, GaussianEvent | NoOpEvent | PureDpEvent | RdpCurveEvent):
                return False
        return True

    def admissible(self, event: DpEvent) -> bool:
        # Linear-in-order curves only: see the module docstring.
        return all(isinstance(leaf, GaussianEvent | NoOpEvent) for leaf, _ in leaves(event))

    def _cost(self, event: DpEvent) -> FloatArray:
        return rdp_curve(event, self.orders)

    def spent(self, total: ArrayLike, delta: float) -> Spent:
        v = self.check_total(total)
        if not v.any():
            return Spent(0.0, check.delta(delta), self.name, order=float(self.orders[0]))
        e = convert(v, self.orders, delta, self.conversion)
        return Spent(e.epsilon, e.delta, self.name, order=e.order)

    def _max_count(self, unit: FloatArray, base: FloatArray, epsilon: float, delta: float) -> int:
        return planning.max_queries(unit, self.orders, epsilon, delta, self.conversion, base)

    def _max_multiplier(self, unit: FloatArray, epsilon: float, delta: float) -> float:
        m = planning.max_multiplier(unit, self.orders, 1, epsilon, delta, self.conversion)
        m *= 1.0 - 1e-12  # the same margin as GaussianDp: callers multiply in any order
        while m > 0 and not self.fits(m * unit, epsilon, delta):
            m = float(np.nextafter(m, 0.0))
        return m

    def offset(self, delta: float) -> FloatArray:
        """The part of epsilon at each order that does not depend on the RDP."""
        return conversion_offset(self.orders, delta, self.conversion)

    def settings(self) -> dict[str, Any]:
        return {"orders": self.orders.tolist(), "conversion": self.conversion.value}


#: Accountant kinds by name; the ledger and the CLI accept exactly these.
ACCOUNTANTS: Mapping[str, Callable[..., Accounting]] = {
    GaussianDp.name: GaussianDp,
    RenyiDp.name: RenyiDp,
}
#: The tightest accountant proven sound for every charge the services make.
DEFAULT_ACCOUNTANT = GaussianDp.name


def make(name: str, settings: Mapping[str, Any] | None = None) -> Accounting:
    """The accountant ``name`` with saved ``settings`` (from :meth:`Accounting.settings`)."""
    if name not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {name!r}; choose one of {', '.join(ACCOUNTANTS)}")
    s = dict(settings or {})
    if name == RenyiDp.name:
        return RenyiDp(
            np.asarray(s.get("orders", DEFAULT_ORDERS), dtype=np.float64),
            Conversion(s.get("conversion", Conversion.IMPROVED.value)),
        )
    if s:
        raise ValueError(f"the {name} accountant takes no settings, got {sorted(s)}")
    return ACCOUNTANTS[name]()
