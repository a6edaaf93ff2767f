"""Per-party RDP accountant: a history of composed events you can save and restore.

One :class:`Accountant` per data owner (an answering party or a teacher). It
composes :class:`~capc.privacy.events.PrivacyEvent` curves by summing RDP at
every order, converts with the improved conversion (Balle et al. 2020, Thm. 21)
on :data:`~capc.privacy.conversion.DEFAULT_ORDERS`, and checks a budget before
composing, never after.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.privacy import validation as check
from capc.privacy.conversion import (
    DEFAULT_ORDERS,
    Conversion,
    Epsilon,
    convert,
)
from capc.privacy.conversion import (
    epsilon as epsilon,  # re-exported: the accountant's public conversion
)
from capc.privacy.events import PrivacyEvent

STATE_VERSION = 1
FloatArray = NDArray[np.float64]


class BudgetExceededError(ValueError):
    """Composing an event would take an owner past its budget."""


@dataclass(frozen=True)
class Budget:
    """An (epsilon, delta) cap for one data owner."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        check.positive(self.epsilon, "budget epsilon")
        check.delta(self.delta)


@dataclass
class _Entry:
    event: PrivacyEvent
    count: int


@dataclass(frozen=True)
class Report:
    """What an owner has spent, in a form for people and for JSON."""

    owner: str
    epsilon: float
    delta: float
    order: float
    conversion: str
    data_dependent: bool
    events: int
    shares: dict[str, float] = field(default_factory=dict)
    budget_epsilon: float | None = None

    @property
    def remaining(self) -> float | None:
        """Epsilon left under the budget, if one was given (never below 0)."""
        if self.budget_epsilon is None:
            return None
        return max(0.0, self.budget_epsilon - self.epsilon)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return {
            "owner": self.owner,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "order": self.order,
            "conversion": self.conversion,
            "accounting": "data-dependent" if self.data_dependent else "data-independent",
            "events": self.events,
            "shares": self.shares,
            "budget_epsilon": self.budget_epsilon,
            "remaining_epsilon": self.remaining,
        }

    def to_text(self) -> str:
        """A short human-readable summary."""
        who = self.owner or "(unnamed owner)"
        lines = [
            f"{who}: epsilon = {self.epsilon:.4f} at delta = {self.delta:g} "
            f"(Renyi order {self.order:g}, {self.conversion} conversion, "
            f"{'data-dependent' if self.data_dependent else 'data-independent'} accounting, "
            f"{self.events} events)"
        ]
        if self.budget_epsilon is not None:
            lines.append(f"  budget {self.budget_epsilon:g}, remaining {self.remaining:.4f}")
        for name, share in sorted(self.shares.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name:<20} {100 * share:5.1f}% of the RDP at the best order")
        return "\n".join(lines)


class Accountant:
    """Composes privacy events for one data owner.

    ``orders``: the Renyi orders (> 1) every event must be computed on.
    """

    def __init__(
        self,
        owner: str = "",
        orders: ArrayLike = DEFAULT_ORDERS,
        conversion: Conversion = Conversion.IMPROVED,
    ) -> None:
        self.owner = owner
        self.orders = check.orders(orders)
        self.conversion = Conversion(conversion)
        self._history: list[_Entry] = []
        self._total = np.zeros_like(self.orders)

    # -- composing -----------------------------------------------------------

    def _check_event(self, event: PrivacyEvent, count: int) -> None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"count must be a non-negative integer, got {count!r}")
        if event.orders.shape != self.orders.shape or not np.array_equal(event.orders, self.orders):
            raise ValueError(
                f"event {event.mechanism!r} was computed on a different order grid "
                f"({event.orders.size} orders) than this accountant ({self.orders.size})"
            )

    def would_exceed(self, event: PrivacyEvent, budget: Budget, count: int = 1) -> bool:
        """True if composing ``count`` copies of ``event`` would spend more than ``budget``."""
        self._check_event(event, count)
        after = self._total + count * event.rdp
        return convert(after, self.orders, budget.delta, self.conversion).epsilon > budget.epsilon

    def compose(self, event: PrivacyEvent, count: int = 1, budget: Budget | None = None) -> None:
        """Add ``count`` applications of ``event``; with ``budget``, refuse (and change
        nothing) if that would exceed it."""
        self._check_event(event, count)
        if budget is not None and self.would_exceed(event, budget, count):
            spent = self.spent(budget.delta).epsilon
            raise BudgetExceededError(
                f"{self.owner or 'owner'}: {count} x {event.mechanism} would exceed the budget "
                f"epsilon={budget.epsilon:g} at delta={budget.delta:g} (already spent {spent:.4f})"
            )
        if count == 0:
            return
        last = self._history[-1] if self._history else None
        if last is not None and last.event.same_as(event):
            last.count += count
        else:
            self._history.append(_Entry(event, count))
        self._total = self._total + count * event.rdp

    # -- reading -------------------------------------------------------------

    @property
    def rdp(self) -> FloatArray:
        """Total RDP at each order (a copy)."""
        return self._total.copy()

    @property
    def history(self) -> list[tuple[PrivacyEvent, int]]:
        """The composed events in order, with their counts."""
        return [(e.event, e.count) for e in self._history]

    def spent(self, delta: float) -> Epsilon:
        """The (epsilon, delta) guarantee of everything composed so far."""
        return convert(self._total, self.orders, delta, self.conversion)

    def remaining(self, budget: Budget) -> float:
        """Epsilon left under ``budget`` (0 when exhausted)."""
        return max(0.0, budget.epsilon - self.spent(budget.delta).epsilon)

    def report(self, delta: float, budget: Budget | None = None) -> Report:
        """Spent epsilon at ``delta``, the best order, and each mechanism's share of it."""
        eps = self.spent(delta)
        i = int(np.flatnonzero(self.orders == eps.order)[0])
        shares: dict[str, float] = {}
        total_at = float(self._total[i])
        for entry in self._history:
            part = entry.count * float(entry.event.rdp[i])
            shares[entry.event.mechanism] = shares.get(entry.event.mechanism, 0.0) + part
        if total_at > 0:
            shares = {k: v / total_at for k, v in shares.items()}
        return Report(
            owner=self.owner,
            epsilon=eps.epsilon,
            delta=eps.delta,
            order=eps.order,
            conversion=self.conversion.value,
            data_dependent=any(e.event.data_dependent for e in self._history),
            events=sum(e.count for e in self._history),
            shares=shares,
            budget_epsilon=None if budget is None else budget.epsilon,
        )

    # -- persistence ---------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore this accountant, JSON-safe."""
        return {
            "version": STATE_VERSION,
            "owner": self.owner,
            "orders": self.orders.tolist(),
            "conversion": self.conversion.value,
            "history": [{"event": e.event.to_dict(), "count": e.count} for e in self._history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this accountant's state with a saved one (validated first)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported accountant state version {state.get('version')!r}")
        orders = check.orders(state["orders"])
        history = []
        total = np.zeros_like(orders)
        for item in state["history"]:
            count = item["count"]
            if not isinstance(count, int) or count < 0:
                raise ValueError(f"invalid event count {count!r} in saved state")
            event = PrivacyEvent.from_dict(item["event"], orders)
            history.append(_Entry(event, count))
            total = total + count * event.rdp
        self.owner = str(state.get("owner", ""))
        self.orders = orders
        self.conversion = Conversion(state["conversion"])
        self._history = history
        self._total = total

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Accountant:
        """A new accountant restored from :meth:`state_dict` output."""
        acc = cls()
        acc.load_state_dict(state)
        return acc
