"""Central-mode labelling: Confident-GNMax over teacher votes until a budget is spent.

Queries are answered in order, by one of two accountants. Both decide where
labelling stops from data-independent charges only: how many labels a run
releases never depends on the private votes except through outputs that
are themselves differentially private (the noisy threshold tests).

- ``rdp``: an RDP filter. Each query is charged the data-independent RDP of
  its threshold test (:func:`capc.privacy.rdp.threshold_data_independent`,
  none for plain GNMax) and, when the noisy test answers it, the
  data-independent RDP of GNMax (:func:`capc.privacy.rdp.gnmax_data_independent`).
  A mechanism runs only if its charge keeps the improved-conversion epsilon,
  minimised over orders, within the budget; the run stops at the first that
  does not. Charging the answer only when the test passed is an adaptive
  choice, made on a private output. The filter is sound for the whole order
  grid at once because every charged curve is linear in the order (Gaussian
  mechanisms): the composed curve is c * order for the running total c, so
  stopping on the minimised epsilon is stopping on c alone, and every
  order's Renyi filter (Feldman and Zrnic 2021) holds with the same
  threshold on c.
- ``gdp``: plain GNMax only (no threshold test), composed exactly as Gaussian
  DP (:mod:`capc.privacy.gaussian_dp`). Every query costs the same whatever
  the votes, so where the run stops depends on nothing but the budget.

Neither ever stops on the data-dependent epsilon of Papernot et al. (2018):
that figure is a function of the votes, so a stop it decided would make the
number of labels a non-private release. ``rdp`` runs report it only as a
side figure, released with smooth-sensitivity noise
(:func:`capc.privacy.smooth_sensitivity.sanitise`) at the order the
data-independent epsilon chose; that release is a further output with its
own cost (included in the figure), not part of ``epsilon``.

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
from capc.privacy.conversion import DEFAULT_ORDERS, Conversion, conversion_offset, convert
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
    or not reached; ``processed``: queries whose whole charge fitted the
    budget (the run stopped before the next). ``epsilon`` (nats, at
    ``delta``): the data-independent epsilon of everything the run
    released, never above ``budget``; by ``rdp`` minimised over orders
    (``order`` the best Renyi order, NaN when nothing ran) and including the threshold test of
    the query the run stopped at when that test fitted (the stop then
    reveals its outcome); by ``gdp`` exact Gaussian DP (``order`` NaN).

    ``sanitised_data_dependent_epsilon`` (nats, ``rdp`` only, else NaN; NaN
    too when nothing was processed): a side figure, the data-dependent
    epsilon of the processed prefix (Papernot et al. 2018) released with
    smooth-sensitivity noise at ``order``, its release's cost included. It
    decides nothing: not where the run stops, not which labels are released.
    """

    budget: float
    labels: NDArray[np.int64]
    processed: int
    epsilon: float
    order: float
    sanitised_data_dependent_epsilon: float
    accountant: str = "rdp"

    @property
    def answered(self) -> NDArray[np.bool_]:
        return np.asarray(self.labels != NOT_ANSWERED, dtype=bool)


@dataclass(frozen=True)
class Filtered:
    """Where the ``rdp`` filter stopped: ``processed`` queries, total RDP ``spent`` (nats,
    one per order) of every mechanism that ran."""

    processed: int
    spent: NDArray[np.float64]


def rdp_filter(
    answered: NDArray[np.bool_],
    params: ConfidentParams,
    budget: float,
    delta: float,
    orders: NDArray[np.float64] = DEFAULT_ORDERS,
) -> Filtered:
    """Run the data-independent RDP filter over queries whose test outcomes are ``answered``.

    In order, each query's threshold test (unless plain GNMax) and then, if
    answered, its GNMax answer run only if the epsilon (nats, improved
    conversion at ``delta``, minimised over ``orders``) after them stays
    within ``budget``. The charges are :func:`rdp.threshold_data_independent`
    and :func:`rdp.gnmax_data_independent`, both linear in the order, which
    is what makes stopping on the minimised epsilon a valid filter (see the
    module's docstring). The votes are not an argument: they cannot move the stop.
    """
    gn = rdp.gnmax_data_independent(params.sigma2, orders)
    test = (
        np.zeros_like(gn)
        if params.threshold is None
        else rdp.threshold_data_independent(params.sigma1, orders)
    )
    if not (
        np.allclose(gn, gn[0] / orders[0] * orders)
        and np.allclose(test, test[0] / orders[0] * orders)
    ):
        raise ValueError("the RDP filter needs charges linear in the order (Gaussian mechanisms)")
    offset = conversion_offset(orders, delta, Conversion.IMPROVED)

    def fits(total: NDArray[np.float64]) -> bool:
        return float(np.min(total + offset)) <= budget

    spent = np.zeros_like(gn)
    for i, was_answered in enumerate(answered):
        after_test = spent + test
        if not fits(after_test):
            return Filtered(i, spent)
        if was_answered:
            after_answer = after_test + gn
            if not fits(after_answer):
                # The test ran (it fitted) and the stop here reveals that it passed.
                return Filtered(i, after_test)
            spent = after_answer
        else:
            spent = after_test
    return Filtered(len(answered), spent)


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
    each epsilon in ``budgets`` (nats) at ``delta`` (that order: accountant, then budget).

    One noise draw serves them all. ``gdp`` needs plain GNMax (``params.threshold`` None).
    ``orders``: the Renyi orders of the ``rdp`` accountant.
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
    out = []
    for budget in budgets:
        run = rdp_filter(answered, params, budget, delta, orders)
        stop = run.processed
        spent = convert(run.spent, orders, delta, Conversion.IMPROVED)
        # Nothing ran: no conversion offset to pay.
        eps, order = (spent.epsilon, spent.order) if run.spent.any() else (0.0, math.nan)
        side = math.nan
        if stop:
            # At the order the data-independent epsilon chose: an order picked on the
            # data-dependent curve would let the votes choose what is released.
            side = sanitise(
                h[:stop],
                answered[:stop],
                num_teachers,
                params.sigma2,
                order,
                delta,
                rng,
                threshold=params.threshold,
                sigma1=None if params.threshold is None else params.sigma1,
            ).epsilon
        out.append(Labelled(budget, _prefix(labels, stop), stop, eps, order, side))
    return out


def _gdp_runs(
    labels: NDArray[np.int64], sigma2: float, budgets: Sequence[float], delta: float
) -> list[Labelled]:
    per_query = gaussian_dp.gnmax_mu(sigma2)
    out = []
    for budget in budgets:
        stop = min(len(labels), gaussian_dp.max_queries(per_query, budget, delta))
        eps = gaussian_dp.epsilon_at(math.sqrt(stop) * per_query, delta) if stop else 0.0
        out.append(Labelled(budget, _prefix(labels, stop), stop, eps, math.nan, math.nan, "gdp"))
    return out
