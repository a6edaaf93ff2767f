"""What one labelling round costs each answering party, before and after it runs.

The guardian reserves the worst case before a round (every query answered)
and charges what happened afterwards (threshold or confidence tests on every
query, answers only on what was released). Both are data-independent, as in
distributed mode nobody sees the histogram. RDP vectors over ``orders``, in
nats; a party whose vote carries weight w is charged w**2 times (its
sensitivity scales by w), and a party that sat a query out (vanishing) is
charged nothing for it. The charges equal composing the events of
``capc.privacy.events`` (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.privacy import rdp
from capc.privacy.conversion import DEFAULT_ORDERS

FloatArray = NDArray[np.float64]
MECHANISMS = ("confident-gnmax", "gnmax", "binary", "tau", "powerset")


@dataclass(frozen=True)
class MechanismSpec:
    """A round's mechanism and noise.

    ``threshold``/``sigma1``: the threshold test of Confident-GNMax and of
    confident Powerset voting, or the per-label confidence test of Binary and
    tau voting (absent when ``sigma1`` is 0). ``num_labels``/``tau`` only for
    multi-label voting.
    """

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
        if self.name == "gnmax" and self.sigma1:
            raise ValueError("GNMax has no threshold test; use confident-gnmax")
        if not (self.sigma1 >= 0 and self.threshold >= 0):
            raise ValueError("sigma1 and threshold must be >= 0")
        if self.name == "tau" and not self.tau > 0:
            raise ValueError("tau voting needs tau > 0")
        if self.multi_label and self.num_labels < 1:
            raise ValueError(f"multi-label voting needs num_labels >= 1, got {self.num_labels}")

    @property
    def multi_label(self) -> bool:
        """Votes and labels are k-bit vectors (Binary, tau, Powerset)."""
        return self.name in ("binary", "tau", "powerset")

    @property
    def confident(self) -> bool:
        """A noisy test decides which queries (or, per label, which labels) are answered."""
        return self.sigma1 > 0

    @property
    def per_label(self) -> bool:
        """Answers are decided label by label (Binary and tau voting)."""
        return self.name in ("binary", "tau")

    def answer_shape(self, queries: int) -> tuple[int, ...]:
        """Shape of the answered mask :meth:`charge` takes: (queries,) or (queries, k)."""
        return (queries, self.num_labels) if self.per_label else (queries,)

    def _squared_sensitivity(self, labels: NDArray[np.float64] | float) -> NDArray[np.float64]:
        """Squared L2 sensitivity of a release over ``labels`` labels (per-label mechanisms)."""
        m = np.asarray(labels, dtype=np.float64)
        if self.name == "tau":
            return np.minimum(2.0 * self.tau**2, m)
        return m

    def charge(
        self, answered: ArrayLike, orders: ArrayLike = DEFAULT_ORDERS, weight: float = 1.0
    ) -> FloatArray:
        """RDP (nats, one value per order) of a round whose outcome is ``answered``.

        ``answered``: bool of :meth:`answer_shape`, True where the query (or
        label) was released; pass only the queries the party voted on. Charged:
        the test on every query (sensitivity 1 for a histogram maximum, the
        vote vector's for per-label tests) and the answer on what was released;
        a weighted party (weight w) pays w**2 times, as its sensitivity scales by w.
        """
        a = np.asarray(answered, dtype=bool)
        o = np.asarray(orders, dtype=np.float64)
        if a.ndim != (2 if self.per_label else 1) or (
            self.per_label and a.shape[1] != self.num_labels
        ):
            raise ValueError(f"answered must have shape {self.answer_shape(len(a))}, got {a.shape}")
        if not self.confident and not a.all():
            raise ValueError(f"{self.name} answers every query; answered must be all True")
        queries = a.shape[0]
        if self.per_label:
            # Gaussian mechanism: RDP alpha * s**2 / (2 sigma**2) for sensitivity s.
            released = float(self._squared_sensitivity(a.sum(axis=1)).sum())
            total = released * rdp.gaussian(1.0, self.sigma, o)
            if self.confident:
                test = float(self._squared_sensitivity(float(self.num_labels)))
                total = total + queries * test * rdp.gaussian(1.0, self.sigma1, o)
        else:
            total = int(a.sum()) * rdp.gnmax_data_independent(self.sigma, o)
            if self.confident:
                total = total + queries * rdp.threshold_data_independent(self.sigma1, o)
        return np.asarray(total * weight**2, dtype=np.float64)

    def worst_case(
        self, queries: int, orders: ArrayLike = DEFAULT_ORDERS, weight: float = 1.0
    ) -> FloatArray:
        """RDP to reserve for ``queries`` queries: every query (and label) answered."""
        return self.charge(np.ones(self.answer_shape(queries), dtype=bool), orders, weight)
