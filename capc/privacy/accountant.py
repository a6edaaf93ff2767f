"""Per-owner accountant: a history of composed events you can save and restore.

One :class:`Accountant` per data owner (an answering party or a teacher). It
keeps the events composed so far (each with a count and a label saying what
produced it) and interprets them with one accountant kind of
:mod:`capc.privacy.accountants` (``rdp`` by default here, ``gdp`` for exact
Gaussian DP). With a budget, composing is a privacy filter: the budget is
checked before anything is added, and only events the kind's filter is proven
for are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capc.privacy import validation as check
from capc.privacy.accountants import Accounting, RenyiDp, Spent, UnsupportedEventError, make
from capc.privacy.conversion import epsilon as epsilon  # re-exported: the RDP conversion
from capc.privacy.events import DpEvent, RdpCurveEvent, from_dict, leaves

STATE_VERSION = 2
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
    event: DpEvent
    count: int
    label: str


@dataclass(frozen=True)
class Report:
    """What an owner has spent, in a form for people and for JSON."""

    owner: str
    epsilon: float
    delta: float
    accountant: str
    order: float | None
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
            "accountant": self.accountant,
            "order": self.order,
            "accounting": "data-dependent" if self.data_dependent else "data-independent",
            "events": self.events,
            "shares": self.shares,
            "budget_epsilon": self.budget_epsilon,
            "remaining_epsilon": self.remaining,
        }

    def to_text(self) -> str:
        """A short human-readable summary."""
        who = self.owner or "(unnamed owner)"
        how = f"Renyi order {self.order:g}, " if self.order is not None else ""
        lines = [
            f"{who}: epsilon = {self.epsilon:.4f} at delta = {self.delta:g} "
            f"({how}{self.accountant} accountant, "
            f"{'data-dependent' if self.data_dependent else 'data-independent'} accounting, "
            f"{self.events} events)"
        ]
        if self.budget_epsilon is not None:
            lines.append(f"  budget {self.budget_epsilon:g}, remaining {self.remaining:.4f}")
        for name, share in sorted(self.shares.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name:<20} {100 * share:5.1f}% of the loss")
        return "\n".join(lines)


def _data_dependent(event: DpEvent) -> bool:
    return any(isinstance(e, RdpCurveEvent) and e.data_dependent for e, _ in leaves(event))


class Accountant:
    """Composes privacy events for one data owner with the accountant kind ``accounting``."""

    def __init__(self, owner: str = "", accounting: Accounting | None = None) -> None:
        self.owner = owner
        self.accounting = accounting if accounting is not None else RenyiDp()
        self._history: list[_Entry] = []
        self._total = self.accounting.zero()

    # -- composing -----------------------------------------------------------

    @staticmethod
    def _check_count(count: int) -> None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"count must be a non-negative integer, got {count!r}")

    def would_exceed(self, event: DpEvent, budget: Budget, count: int = 1) -> bool:
        """True if composing ``count`` copies of ``event`` would spend more than ``budget``."""
        self._check_count(count)
        unproven = [e.label for e in self._history if not self.accounting.admissible(e.event)]
        if unproven:
            raise UnsupportedEventError(
                f"this history holds events the {self.accounting.name} budget filter is not "
                f"proven for ({', '.join(sorted(set(unproven)))}); it cannot filter further steps"
            )
        after = self._total + count * self.accounting.filter_cost(event)
        return not self.accounting.fits(after, budget.epsilon, budget.delta)

    def compose(
        self, event: DpEvent, count: int = 1, budget: Budget | None = None, label: str = ""
    ) -> None:
        """Add ``count`` applications of ``event`` (``label``: what produced it); with
        ``budget``, refuse (and change nothing) if that would exceed it."""
        self._check_count(count)
        cost = self.accounting.cost(event)
        if budget is not None and self.would_exceed(event, budget, count):
            spent = self.spent(budget.delta).epsilon
            raise BudgetExceededError(
                f"{self.owner or 'owner'}: {count} x {label or event.kind} would exceed the budget "
                f"epsilon={budget.epsilon:g} at delta={budget.delta:g} (already spent {spent:.4f})"
            )
        if count == 0:
            return
        name = label or event.kind
        last = self._history[-1] if self._history else None
        if last is not None and last.event == event and last.label == name:
            last.count += count
        else:
            self._history.append(_Entry(event, count, name))
        self._total = self._total + count * cost

    # -- reading -------------------------------------------------------------

    @property
    def total(self) -> FloatArray:
        """The accountant's loss vector of everything composed (a copy)."""
        return self._total.copy()

    @property
    def history(self) -> list[tuple[DpEvent, int]]:
        """The composed events in order, with their counts."""
        return [(e.event, e.count) for e in self._history]

    def spent(self, delta: float) -> Spent:
        """The (epsilon, delta) guarantee of everything composed so far."""
        return self.accounting.spent(self._total, delta)

    def remaining(self, budget: Budget) -> float:
        """Epsilon left under ``budget`` (0 when exhausted)."""
        return max(0.0, budget.epsilon - self.spent(budget.delta).epsilon)

    def report(self, delta: float, budget: Budget | None = None) -> Report:
        """Spent epsilon at ``delta`` and each label's share of the loss.

        Shares are of the loss vector at the best order (``rdp``) or of mu**2 (``gdp``).
        """
        eps = self.spent(delta)
        i = 0
        if eps.order is not None and isinstance(self.accounting, RenyiDp):
            i = int(np.flatnonzero(self.accounting.orders == eps.order)[0])
        shares: dict[str, float] = {}
        for entry in self._history:
            part = entry.count * float(self.accounting.cost(entry.event)[i])
            shares[entry.label] = shares.get(entry.label, 0.0) + part
        total_at = float(self._total[i])
        if total_at > 0:
            shares = {k: v / total_at for k, v in shares.items()}
        return Report(
            owner=self.owner,
            epsilon=eps.epsilon,
            delta=eps.delta,
            accountant=self.accounting.name,
            order=eps.order,
            data_dependent=any(_data_dependent(e.event) for e in self._history),
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
            "accountant": {"name": self.accounting.name, **self.accounting.settings()},
            "history": [
                {"event": e.event.to_dict(), "count": e.count, "label": e.label}
                for e in self._history
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this accountant's state with a saved one (validated first)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported accountant state version {state.get('version')!r}")
        settings = dict(state["accountant"])
        accounting = make(str(settings.pop("name")), settings)
        history = []
        total = accounting.zero()
        for item in state["history"]:
            count = item["count"]
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError(f"invalid event count {count!r} in saved state")
            event = from_dict(item["event"])
            history.append(_Entry(event, count, str(item.get("label", event.kind))))
            total = total + count * accounting.cost(event)
        self.owner = str(state.get("owner", ""))
        self.accounting = accounting
        self._history = history
        self._total = total

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Accountant:
        """A new accountant restored from :meth:`state_dict` output."""
        acc = cls()
        acc.load_state_dict(state)
        return acc
