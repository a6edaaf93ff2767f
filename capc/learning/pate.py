"""Central-mode labelling: Confident-GNMax over teacher votes until a budget is spent.

Queries are answered in order, by one of two accountants:

- ``rdp``: each query is charged its data-dependent threshold-test RDP and,
  when answered, its data-dependent GNMax RDP (Papernot et al. 2018, computed
  by :mod:`capc.privacy.rdp`); the run stops before the first query whose
  charge would take the total over the budget, as
  :meth:`capc.privacy.accountant.Accountant.compose` refuses it. The
  data-dependent epsilon depends on the votes; its release with
  smooth-sensitivity noise is reported beside it.
- ``gdp``: plain GNMax only (no threshold test), composed exactly as Gaussian
  DP (:mod:`capc.privacy.gaussian_dp`). Every query costs the same whatever
  the votes, so where the run stops depends on nothing but the budget, and
  the epsilon it reports is data-independent and needs no sanitising.

One noise draw serves every budget and accountant, so the runs at eps 5, 10
and 20 are prefixes of one run, and the accountants' runs differ only in
where they stop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from capc.privacy import gaussian_dp, rdp
from capc.privacy.conversion import DEFAULT_ORDERS, Conversion, conversion_offset
from capc.privacy.mechanisms import confident_gnmax, gnmax
from capc.privacy.mechanisms.single_label import NOT_ANSWERED
from capc.privacy.randomness import SecureRandom
from capc.privacy.smooth_sensitivity import sanitise

#: The accountants :func:`label_within_budgets` knows (see the module's docstring).
ACCOUNTANTS = ("rdp", "gdp")


@dataclass(frozen=True)
class ConfidentParams:
    """Confident-GNMax: threshold T and noise sigma1 of the test, noise sigma2 of the answer
    (all in votes). ``threshold=None`` is plain GNMax: no test, every query answered,
    ``sigma1`` unused."""

    threshold: float | None
    sigma1: float
    sigma2: float

    def __post_init__(self) -> None:
        if self.threshold is not None and not self.threshold >= 0:
            raise ValueError("Confident-GNMax needs threshold >= 0 (or None for plain GNMax)")
        if not (self.sigma1 > 0 and self.sigma2 > 0):
            raise ValueError("Confident-GNMax needs positive sigma1 and sigma2")

    def scaled(self, teachers: int, reference: int = 100) -> ConfidentParams:
        """The same fractions of the vote for ``teachers`` instead of ``reference`` teachers."""
        f = teachers / reference
        t = None if self.threshold is None else self.threshold * f
        return ConfidentParams(t, self.sigma1 * f, self.sigma2 * f)


@dataclass(frozen=True)
class Labelled:
    """The outcome of labelling within one budget.

    ``labels`` (N,): the noisy label, or -1 where the query was not answered
    or not reached; ``processed``: queries charged before the budget ran out;
    ``epsilon``: epsilon spent at ``delta``. By ``accountant`` ``rdp``: the
    data-dependent epsilon minimised over orders (``order`` the best) and
    ``sanitised_epsilon`` its release with smooth-sensitivity noise at that
    order; by ``gdp``: the exact data-independent epsilon, released as it is
    (``order`` NaN, ``sanitised_epsilon`` equal to ``epsilon``).
    """

    budget: float
    labels: NDArray[np.int64]
    processed: int
    epsilon: float
    order: float
    sanitised_epsilon: float
    accountant: str = "rdp"

    @property
    def answered(self) -> NDArray[np.bool_]:
        return np.asarray(self.labels != NOT_ANSWERED, dtype=bool)


def per_query_rdp(
    histograms: NDArray[np.float64],
    answered: NDArray[np.bool_],
    params: ConfidentParams,
    orders: NDArray[np.float64] = DEFAULT_ORDERS,
) -> NDArray[np.float64]:
    """Data-dependent RDP (N, orders) of each query: its threshold test (unless plain
    GNMax), plus GNMax if answered."""
    out = np.zeros((len(histograms), len(orders)))
    for i, h in enumerate(histograms):
        if params.threshold is not None:
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
    accountants: Sequence[str] = ("rdp",),
) -> list[Labelled]:
    """Label (N, K) vote ``histograms`` in order, for each accountant in ``accountants`` and
    each epsilon in ``budgets`` at ``delta`` (that order: accountant, then budget).

    One noise draw serves them all. ``gdp`` needs plain GNMax (``params.threshold`` None).
    """
    unknown = [a for a in accountants if a not in ACCOUNTANTS]
    if unknown or not accountants:
        raise ValueError(
            f"unknown accountants {unknown or 'none given'}; choose from {', '.join(ACCOUNTANTS)}"
        )
    if "gdp" in accountants and params.threshold is not None:
        raise ValueError(
            "the gdp accountant composes plain GNMax only (threshold None): under "
            "Confident-GNMax whether a query's answer is charged depends on its test, "
            "which the rdp accountant handles"
        )
    bad = [b for b in budgets if not b > 0]
    if bad:
        raise ValueError(f"budgets must be positive, got {bad[0]}")
    h = np.asarray(histograms, dtype=np.float64)
    if params.threshold is None:
        labels = gnmax(h, params.sigma2, rng)
        answered = np.ones(len(h), dtype=bool)
    else:
        result = confident_gnmax(h, params.threshold, params.sigma1, params.sigma2, rng)
        labels, answered = result.labels, result.answered
    out: list[Labelled] = []
    for accountant in accountants:
        if accountant == "rdp":
            out += _rdp_runs(h, labels, answered, params, budgets, delta, rng, num_teachers, orders)
        else:
            out += _gdp_runs(labels, params.sigma2, budgets, delta)
    return out


def _prefix(labels: NDArray[np.int64], stop: int) -> NDArray[np.int64]:
    out = np.full(len(labels), NOT_ANSWERED, dtype=np.int64)
    out[:stop] = labels[:stop]
    return out


def _rdp_runs(
    h: NDArray[np.float64],
    labels: NDArray[np.int64],
    answered: NDArray[np.bool_],
    params: ConfidentParams,
    budgets: Sequence[float],
    delta: float,
    rng: SecureRandom,
    num_teachers: int,
    orders: NDArray[np.float64],
) -> list[Labelled]:
    costs = per_query_rdp(h, answered, params, orders)
    offset = conversion_offset(orders, delta, Conversion.IMPROVED)
    spent = np.cumsum(costs, axis=0) + offset  # epsilon at every order after each query
    best = spent.min(axis=1)
    out = []
    for budget in budgets:
        over = np.flatnonzero(best > budget)
        stop = int(over[0]) if over.size else len(h)
        if stop == 0:
            out.append(Labelled(budget, _prefix(labels, 0), 0, 0.0, float(orders[0]), 0.0))
            continue
        j = int(np.argmin(spent[stop - 1]))
        released = sanitise(
            h[:stop],
            answered[:stop],
            num_teachers,
            params.sigma2,
            float(orders[j]),
            delta,
            rng,
            threshold=params.threshold,
            sigma1=None if params.threshold is None else params.sigma1,
        )
        out.append(
            Labelled(
                budget,
                _prefix(labels, stop),
                stop,
                max(0.0, float(spent[stop - 1, j])),
                float(orders[j]),
                released.epsilon,
            )
        )
    return out


def _gdp_runs(
    labels: NDArray[np.int64], sigma2: float, budgets: Sequence[float], delta: float
) -> list[Labelled]:
    per_query = gaussian_dp.gnmax_mu(sigma2)
    out = []
    for budget in budgets:
        stop = min(len(labels), gaussian_dp.max_queries(per_query, budget, delta))
        eps = gaussian_dp.epsilon_at(math.sqrt(stop) * per_query, delta) if stop else 0.0
        out.append(Labelled(budget, _prefix(labels, stop), stop, eps, math.nan, eps, "gdp"))
    return out
