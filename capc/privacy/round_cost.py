"""What one labelling round costs each answering party, before and after it runs.

The guardian reserves the worst case before a round (every query answered)
and charges what happened afterwards (threshold tests on every query, GNMax
only on answered ones). Both are data-independent, as in distributed mode
nobody sees the histogram. RDP vectors over ``orders``, in nats; a party whose
vote carries weight w is charged w**2 times (its sensitivity scales by w).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.privacy import events
from capc.privacy.conversion import DEFAULT_ORDERS

FloatArray = NDArray[np.float64]
MECHANISMS = ("confident-gnmax", "gnmax", "binary", "tau", "powerset")


@dataclass(frozen=True)
class MechanismSpec:
    """A round's mechanism and noise. ``threshold``/``sigma1`` only for Confident-GNMax (and
    multi-label confidence tests); ``num_labels``/``tau`` only for multi-label voting."""

    name: str
    sigma: float
    threshold: float = 0.0
    sigma1: float = 0.0
    num_labels: int = 1
    tau: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {self.name!r}")
        if not self.sigma > 0:
            raise ValueError(f"sigma must be positive, got {self.sigma}")
        if self.name == "confident-gnmax" and not self.sigma1 > 0:
            raise ValueError("Confident-GNMax needs sigma1 > 0 for its threshold test")
        if self.name == "tau" and not self.tau > 0:
            raise ValueError("tau voting needs tau > 0")

    def _answer_event(self, orders: ArrayLike) -> FloatArray:
        if self.name in ("confident-gnmax", "gnmax"):
            return events.gnmax(self.sigma, orders).rdp
        if self.name == "binary":
            return events.multilabel_binary(self.num_labels, self.sigma, orders).rdp
        if self.name == "tau":
            return events.multilabel_tau(self.num_labels, self.tau, self.sigma, orders).rdp
        return events.multilabel_powerset(self.sigma, orders).rdp

    def _threshold_event(self, orders: ArrayLike) -> FloatArray:
        if self.name != "confident-gnmax":
            return np.zeros(np.shape(orders), dtype=np.float64)
        return events.threshold_test(self.threshold, self.sigma1, orders).rdp

    def worst_case(
        self, queries: int, orders: ArrayLike = DEFAULT_ORDERS, weight: float = 1.0
    ) -> FloatArray:
        """RDP to reserve for ``queries`` queries: every query answered."""
        return self.actual(queries, queries, orders, weight)

    def actual(
        self, queries: int, answered: int, orders: ArrayLike = DEFAULT_ORDERS, weight: float = 1.0
    ) -> FloatArray:
        """RDP of a finished round: threshold tests on all queries, answers on ``answered``."""
        if not 0 <= answered <= queries:
            raise ValueError(f"answered must lie in [0, {queries}], got {answered}")
        total = queries * self._threshold_event(orders) + answered * self._answer_event(orders)
        return np.asarray(total * weight**2, dtype=np.float64)
