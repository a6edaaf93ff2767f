"""Central mode's one budget filter: how many queries, labelled in order, a fresh cap of
epsilon admits.

Every central labelling run (:mod:`capc.learning.pate`, the experiments) labels its
queries once through :mod:`capc.round.central` and then asks this filter where each
budget stops. The filter reads the mechanism, the cap and which queries were answered
(the noisy tests' outcomes, themselves differentially private outputs): never the
votes, so the votes cannot move the stop. Two rules, both privacy filters:

- per query (``rounds=None``): each query's threshold test (none for a mechanism
  without one) runs if its charge fits on top of what was charged so far, then, if
  the test answered it, its answer if that fits too (the tightest: a stop after a
  passed test reveals only that the test passed, and its charge is counted);
- the guardian's ledger (``rounds=k``): rounds of at most ``k`` queries, each
  admitted only while its worst case (every query answered) fits on top of what
  earlier rounds were charged, then charged what happened; where a whole round no
  longer fits, the largest that does.

Charges are the mechanism's own events as the ledger charges them, in an accountant of
:mod:`capc.privacy.accountants` (its ``filter_cost``: refused where the filter is not
proven).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.mechanisms import Mechanism
from capc.privacy import validation as check
from capc.privacy.accountants import Accounting, RenyiDp

#: Queries whose running charge one search step sums at once (memory: 2 x this x the
#: accountant's loss vector).
_CHUNK = 1024


@dataclass(frozen=True)
class Filtered:
    """Where a budget filter stopped: ``processed`` queries, and the accountant's loss
    vector ``spent`` of every charge it made (a stop after a passed test included)."""

    processed: int
    spent: NDArray[np.float64]


def budget_filter(
    answered: ArrayLike,
    mechanism: Mechanism,
    budget: float,
    delta: float,
    accounting: Accounting | None = None,
    *,
    weight: float = 1.0,
    voting: ArrayLike | None = None,
    rounds: int | None = None,
) -> Filtered:
    """The queries a fresh cap of ``budget`` (epsilon, nats, at ``delta``) admits when they
    run in order and their outcomes are ``answered`` (N,) (the mechanism's answer shape
    with ``rounds``), by ``accounting`` (default Renyi DP on the default orders).

    ``rounds=None``: the per-query filter, for one party of vote weight ``weight`` that
    votes on the queries of ``voting`` (N,) (default all; a query it sits out costs it
    nothing). ``rounds=k``: the guardian's rounds of at most ``k`` queries (weight 1,
    every query voted on). See the module for both rules. The votes are not an
    argument: they cannot move the stop.
    """
    acct = accounting if accounting is not None else RenyiDp()
    # Checked here, not by the accountant: Renyi DP's ``fits`` would let an infinite cap
    # admit every query, and an empty run would never look at delta.
    budget, delta = check.non_negative(budget, "budget"), check.delta(delta)
    if rounds is not None:
        if voting is not None or weight != 1.0:
            raise ValueError("the guardian's rounds filter one party of weight 1 voting on all")
        if rounds < 1:
            raise ValueError(f"rounds hold at least one query, got {rounds}")
        return _by_rounds(np.asarray(answered, dtype=bool), mechanism, budget, delta, acct, rounds)
    a = np.asarray(answered, dtype=bool)
    if a.ndim != 1:
        raise ValueError(f"the per-query filter takes one outcome per query (N,), got {a.shape}")
    on = np.ones(len(a), dtype=bool) if voting is None else np.asarray(voting, dtype=bool)
    if on.shape != a.shape:
        raise ValueError(f"voting must have shape {a.shape}, got {on.shape}")
    # One query's cost, as the ledger charges it: the test alone when it declined, the
    # test and the answer when it answered.
    declined = (
        acct.filter_cost(mechanism.event(np.zeros(1, dtype=bool), weight))
        if mechanism.confident
        else acct.zero()
    )
    answer = acct.filter_cost(mechanism.event(np.ones(1, dtype=bool), weight)) - declined
    return _per_query(a, on, declined, answer, budget, delta, acct)


def _per_query(
    answered: NDArray[np.bool_],
    voting: NDArray[np.bool_],
    declined: NDArray[np.float64],
    answer: NDArray[np.float64],
    budget: float,
    delta: float,
    acct: Accounting,
) -> Filtered:
    """The first charge that does not fit, found by search over the running charge (it
    only grows: each charge is non-negative), summed in the order a query-by-query loop
    adds them, so every total is that loop's to the last bit."""
    spent = acct.zero()
    for lo in range(0, len(answered), _CHUNK):
        a, on = answered[lo : lo + _CHUNK], voting[lo : lo + _CHUNK]
        # Steps 2i and 2i + 1: query i's test, then its answer (0 where none ran).
        steps = np.empty((2 * len(a), len(spent)))
        steps[0::2] = declined * on[:, None]
        steps[1::2] = answer * (a & on)[:, None]
        steps[0] += spent
        running = np.cumsum(steps, axis=0)
        if acct.fits(running[-1], budget, delta):
            spent = running[-1]
            continue
        first, last = 0, len(running) - 1  # running[last] does not fit
        while first < last:
            mid = (first + last) // 2
            if acct.fits(running[mid], budget, delta):
                first = mid + 1
            else:
                last = mid
        # A test that does not fit stops before its query; an answer that does not fit
        # stops after its test ran (the stop reveals that the test passed).
        before = running[first - 1] if first else spent
        return Filtered(lo + first // 2, before)
    return Filtered(len(answered), spent)


def _by_rounds(
    answered: NDArray[np.bool_],
    mechanism: Mechanism,
    budget: float,
    delta: float,
    acct: Accounting,
    size: int,
) -> Filtered:
    unit = acct.filter_cost(mechanism.per_query())
    spent, done = acct.zero(), 0
    while done < len(answered):
        batch = min(size, len(answered) - done, acct.max_count_of(unit, budget, delta, spent))
        if batch < 1:
            break
        worst = acct.filter_cost(mechanism.worst_case(batch))
        if not acct.fits(spent + worst, budget, delta):
            raise RuntimeError(f"a round of {batch} does not fit although max_count said so")
        spent = spent + acct.filter_cost(mechanism.event(answered[done : done + batch]))
        done += batch
    return Filtered(done, spent)


__all__ = ["Filtered", "budget_filter"]
