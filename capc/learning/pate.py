"""Central-mode labelling: GNMax or Confident-GNMax over teacher votes until a budget is spent.

The mechanism is the services' own object (:mod:`capc.mechanisms`): its noise
draw (:meth:`~capc.mechanisms.Mechanism.draw_noise`, in the guardian's order),
its plaintext oracle (:meth:`~capc.mechanisms.Mechanism.oracle`, what the
circuit releases for that noise, and what the end-to-end tests replay the
networked rounds against) and its privacy events
(:meth:`~capc.mechanisms.Mechanism.event`). So central labels with a seeded
noise stream are bit for bit those of a networked round with the same votes
and noise.

Queries are answered in order, and a privacy filter decides where labelling
stops, with one of the accountants of :mod:`capc.privacy.accountants` (the
ledger's own). The stop depends on data-independent charges only: how many
labels a run releases never depends on the private votes except through
outputs that are themselves differentially private (the noisy threshold
tests). Each query is charged the mechanism's event for one query: its
threshold test (none for plain GNMax) and, when the noisy test answers it,
its answer; a mechanism runs only if its charge keeps the total within the
budget (:func:`capc.round.central_budget.budget_filter`, central mode's one filter).

- ``rdp``: Renyi DP, minimised over orders. Sound as a filter because every
  charge is linear in the order (docs/privacy.md, "The budget filter").
- ``gdp``: exact Gaussian DP, a filter under full adaptivity (Smith and
  Thakurta 2022); the tightest.

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

The labels come from the protocol itself run in one process
(:func:`capc.round.central.label_histograms`: the guardian, one party holding the
ensemble and the student), computed by the mechanism's oracle (``labels_by="oracle"``,
the default and the fastest) or by the real garbled circuit (``labels_by="2pc"``), bit
for bit the same labels for the same noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from capc.mechanisms import Mechanism, MechanismError, from_config
from capc.mechanisms.base import NOT_ANSWERED
from capc.mechanisms.confident_gnmax import ConfidentGNMax
from capc.mechanisms.gnmax import GNMax
from capc.privacy import accountants as kinds
from capc.privacy.accountants import Accounting, RenyiDp
from capc.privacy.conversion import DEFAULT_ORDERS
from capc.privacy.randomness import SecureRandom
from capc.privacy.smooth_sensitivity import sanitise
from capc.round.central import Mode, label_histograms
from capc.round.central_budget import budget_filter

#: The accountants :func:`label_within_budgets` knows (see the module's docstring).
ACCOUNTANTS = tuple(kinds.ACCOUNTANTS)

#: Where the labels come from (see the module's docstring).
LABELS_BY = ("oracle", "2pc")

#: The mechanisms central labelling runs: those with the data-dependent analysis its
#: sanitised side figure reports (robust-confident-gnmax has none).
CENTRAL_MECHANISMS = (GNMax.name, ConfidentGNMax.name)


@dataclass(frozen=True)
class ConfidentParams:
    """How ``capc diet`` and its experiments name the mechanism: threshold T and noise
    sigma1 of the test, noise sigma2 of the answer (all in votes). ``threshold=None`` is
    plain GNMax: no test, every query answered, ``sigma1`` unused.

    A configuration only: :meth:`mechanism` turns it into the registered mechanism
    object, which does all the noise, labels and cost.
    """

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

    def mechanism(self, classes: int) -> Mechanism:
        """The mechanism over ``classes`` classes: gnmax, or confident-gnmax with a test."""
        if self.threshold is None:
            return from_config({"name": GNMax.name, "sigma": self.sigma2}, classes)
        return from_config(
            {
                "name": ConfidentGNMax.name,
                "sigma": self.sigma2,
                "threshold": self.threshold,
                "sigma1": self.sigma1,
            },
            classes,
        )


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


def label_within_budgets(
    histograms: NDArray[np.float64],
    mechanism: Mechanism,
    budgets: Sequence[float],
    delta: float,
    rng: SecureRandom,
    *,
    num_teachers: int,
    orders: NDArray[np.float64] = DEFAULT_ORDERS,
    accountants: Sequence[str] = ("rdp",),
    labels_by: str = "oracle",
) -> list[Labelled]:
    """Label (N, K) vote ``histograms`` in order, for each accountant in ``accountants`` and
    each epsilon in ``budgets`` (nats) at ``delta`` (that order: accountant, then budget).

    One noise draw serves them all: ``mechanism.draw_noise(N, rng)``, the guardian's
    draw, in one round of :func:`capc.round.central.label_histograms` (integer
    histograms whose rows total ``num_teachers``): with ``labels_by="oracle"`` the
    mechanism's oracle on the circuit's grid, with ``"2pc"`` the real garbled circuit,
    bit for bit the same labels, what a networked round releases for the same votes and
    noise. ``orders``: the Renyi orders of the ``rdp`` accountant. Each budget's stop is
    :func:`capc.round.central_budget.budget_filter`'s per-query rule: it sees only which
    queries were answered.
    """
    if mechanism.name not in CENTRAL_MECHANISMS:
        raise MechanismError(
            f"central labelling runs {' or '.join(CENTRAL_MECHANISMS)}, not {mechanism.name}"
        )
    unknown = [a for a in accountants if a not in ACCOUNTANTS]
    if unknown or not accountants:
        raise ValueError(
            f"unknown accountants {unknown or 'none given'}; choose from {', '.join(ACCOUNTANTS)}"
        )
    bad = [b for b in budgets if not b > 0]
    if bad:
        raise ValueError(f"budgets must be positive, got {bad[0]}")
    if labels_by not in LABELS_BY:
        raise ValueError(f"labels_by must be one of {', '.join(LABELS_BY)}, got {labels_by!r}")
    h = np.asarray(histograms, dtype=np.float64)
    mode: Mode = "2pc" if labels_by == "2pc" else "oracle"
    labels, answered = label_histograms(h, mechanism, num_teachers, rng, mode=mode)
    out: list[Labelled] = []
    for name in accountants:
        acct = RenyiDp(orders) if name == RenyiDp.name else kinds.make(name)
        out += _runs(h, labels, answered, mechanism, budgets, delta, rng, num_teachers, acct)
    return out


def _prefix(labels: NDArray[np.int64], stop: int) -> NDArray[np.int64]:
    out = np.full(len(labels), NOT_ANSWERED, dtype=np.int64)
    out[:stop] = labels[:stop]
    return out


def _runs(
    h: NDArray[np.float64],
    labels: NDArray[np.int64],
    answered: NDArray[np.bool_],
    mechanism: Mechanism,
    budgets: Sequence[float],
    delta: float,
    rng: SecureRandom,
    num_teachers: int,
    acct: Accounting,
) -> list[Labelled]:
    params = mechanism.params.model_dump()
    confident = mechanism.confident
    out = []
    for budget in budgets:
        run = budget_filter(answered, mechanism, budget, delta, acct)
        stop = run.processed
        spent = acct.spent(run.spent, delta)
        # Nothing ran: no conversion offset to pay.
        eps = spent.epsilon if run.spent.any() else 0.0
        order = spent.order if spent.order is not None and run.spent.any() else math.nan
        side = math.nan
        if stop and not math.isnan(order):
            # At the order the data-independent epsilon chose: an order picked on the
            # data-dependent curve would let the votes choose what is released.
            side = sanitise(
                h[:stop],
                answered[:stop],
                num_teachers,
                float(params["sigma"]),
                order,
                delta,
                rng,
                threshold=float(params["threshold"]) if confident else None,
                sigma1=float(params["sigma1"]) if confident else None,
            ).epsilon
        out.append(Labelled(budget, _prefix(labels, stop), stop, eps, order, side, acct.name))
    return out
