"""Central-mode labelling: Confident-GNMax over teacher votes until a budget is spent.

Queries are answered in order. Each one is charged its data-dependent
threshold-test RDP and, when answered, its data-dependent GNMax RDP
(Papernot et al. 2018, computed by :mod:`capc.privacy.rdp`); the run stops
before the first query whose charge would take the total over the budget,
as :meth:`capc.privacy.accountant.Accountant.compose` refuses it. One noise
draw serves every budget, so the runs at eps 5, 10 and 20 are prefixes of
one run. The data-dependent epsilon depends on the votes; its release with
smooth-sensitivity noise is reported beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from capc.privacy import rdp
from capc.privacy.conversion import DEFAULT_ORDERS, Conversion, conversion_offset
from capc.privacy.mechanisms import confident_gnmax
from capc.privacy.mechanisms.single_label import NOT_ANSWERED
from capc.privacy.randomness import SecureRandom
from capc.privacy.smooth_sensitivity import sanitise


@dataclass(frozen=True)
class ConfidentParams:
    """Confident-GNMax: threshold T and noise sigma1 of the test, noise sigma2 of the answer
    (all in votes)."""

    threshold: float
    sigma1: float
    sigma2: float

    def __post_init__(self) -> None:
        if not (self.threshold >= 0 and self.sigma1 > 0 and self.sigma2 > 0):
            raise ValueError("Confident-GNMax needs threshold >= 0 and positive sigma1, sigma2")

    def scaled(self, teachers: int, reference: int = 100) -> ConfidentParams:
        """The same fractions of the vote for ``teachers`` instead of ``reference`` teachers."""
        f = teachers / reference
        return ConfidentParams(self.threshold * f, self.sigma1 * f, self.sigma2 * f)


@dataclass(frozen=True)
class Labelled:
    """The outcome of labelling within one budget.

    ``labels`` (N,): the noisy label, or -1 where the query was not answered
    or not reached; ``processed``: queries charged before the budget ran out;
    ``epsilon``: data-dependent epsilon spent at ``delta``, minimised over
    orders (``order`` the best); ``sanitised_epsilon``: its release with
    smooth-sensitivity noise at that order.
    """

    budget: float
    labels: NDArray[np.int64]
    processed: int
    epsilon: float
    order: float
    sanitised_epsilon: float

    @property
    def answered(self) -> NDArray[np.bool_]:
        return np.asarray(self.labels != NOT_ANSWERED, dtype=bool)


def per_query_rdp(
    histograms: NDArray[np.float64],
    answered: NDArray[np.bool_],
    params: ConfidentParams,
    orders: NDArray[np.float64] = DEFAULT_ORDERS,
) -> NDArray[np.float64]:
    """Data-dependent RDP (N, orders) of each query: its threshold test, plus GNMax if answered."""
    out = np.empty((len(histograms), len(orders)))
    for i, h in enumerate(histograms):
        out[i] = rdp.threshold(h, params.threshold, params.sigma1, orders)
        if answered[i]:
            out[i] += rdp.gnmax(h, params.sigma2, orders)
    return out


def label_within_budgets(
    histograms: NDArray[np.float64],
    params: ConfidentParams,
    budgets: Sequence[float],
    delta: float,
    rng: SecureRandom,
    *,
    num_teachers: int,
    orders: NDArray[np.float64] = DEFAULT_ORDERS,
) -> list[Labelled]:
    """Label (N, K) vote ``histograms`` in order, for each epsilon in ``budgets`` at ``delta``."""
    h = np.asarray(histograms, dtype=np.float64)
    result = confident_gnmax(h, params.threshold, params.sigma1, params.sigma2, rng)
    costs = per_query_rdp(h, result.answered, params, orders)
    offset = conversion_offset(orders, delta, Conversion.IMPROVED)
    spent = np.cumsum(costs, axis=0) + offset  # epsilon at every order after each query
    best = spent.min(axis=1)
    out = []
    for budget in budgets:
        if not budget > 0:
            raise ValueError(f"budgets must be positive, got {budget}")
        over = np.flatnonzero(best > budget)
        stop = int(over[0]) if over.size else len(h)
        labels = np.full(len(h), NOT_ANSWERED, dtype=np.int64)
        labels[:stop] = result.labels[:stop]
        if stop == 0:
            out.append(Labelled(budget, labels, 0, 0.0, float(orders[0]), 0.0))
            continue
        j = int(np.argmin(spent[stop - 1]))
        released = sanitise(
            h[:stop],
            result.answered[:stop],
            num_teachers,
            params.sigma2,
            float(orders[j]),
            delta,
            rng,
            threshold=params.threshold,
            sigma1=params.sigma1,
        )
        out.append(
            Labelled(
                budget,
                labels,
                stop,
                max(0.0, float(spent[stop - 1, j])),
                float(orders[j]),
                released.epsilon,
            )
        )
    return out
