"""The reservation rule: which parties a round may be reserved for, decided once.

This is the budget filter every ledger applies before anything is spent: a party
is reserved for only when its charges and open reservations plus the round's worst
case still fit its cap, and (when the querier has an allowance) when what the
querier's rounds hold of it plus that worst case fit the allowance; a party not
active is left out; below quorum nothing is reserved. The memory ledger and the SQL
ledger both call :func:`decide`; the SQL ledger adds only the row locks around it
and the writes after it, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from capc.privacy.accountants import Accounting
from capc.round.errors import LedgerValueError, QuorumError, UnknownPartyError

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Standing:
    """What a ledger holds of one party when a round asks for it.

    ``cap``: its epsilon cap at the ledger's delta; ``loss``: the loss vector of its
    charges and open reservations; ``querier_loss``: the part of it this round's
    querier's rounds hold (None: none yet)."""

    cap: float
    active: bool
    loss: FloatArray
    querier_loss: FloatArray | None = None


@dataclass(frozen=True)
class Admission:
    """Who a round is reserved for: ``included`` in the order asked, ``excluded`` party ->
    epsilon it has left (0 for a party not active)."""

    included: tuple[str, ...]
    excluded: Mapping[str, float]


def check_round(queries: int, quorum: int) -> None:
    """LedgerValueError unless a round asks at least one query and a quorum of one."""
    if queries < 1:
        raise LedgerValueError(f"a round has at least one query, got {queries}")
    if quorum < 1:
        raise LedgerValueError(f"quorum must be >= 1, got {quorum}")


def decide(
    accounting: Accounting,
    delta: float,
    costs: Mapping[str, FloatArray],
    standing: Mapping[str, Standing],
    *,
    allowance: float | None,
    quorum: int,
    queries: int,
) -> Admission:
    """Apply the budget filter to a round of ``queries`` queries whose worst case costs
    party ``p`` the loss vector ``costs[p]``.

    UnknownPartyError when a party of ``costs`` has no ``standing``; QuorumError (its
    ``remaining``: every excluded party's epsilon left) when fewer than ``quorum``
    parties fit. Pure: nothing is written, whatever the outcome."""
    check_round(queries, quorum)
    names = sorted(costs)
    unknown = [p for p in names if p not in standing]
    if unknown:
        raise UnknownPartyError(f"unknown parties {unknown}; register them first")
    included: list[str] = []
    excluded: dict[str, float] = {}
    for p in names:
        s = standing[p]
        if not s.active:
            excluded[p] = 0.0
            continue
        held = accounting.zero() if s.querier_loss is None else s.querier_loss
        fits = accounting.fits(s.loss + costs[p], s.cap, delta)
        if allowance is not None:
            fits = fits and accounting.fits(held + costs[p], allowance, delta)
        if fits:
            included.append(p)
            continue
        # What a party has left is only worked out for a refusal's message.
        left = s.cap - accounting.spent(s.loss, delta).epsilon
        if allowance is not None:
            left = min(left, allowance - accounting.spent(held, delta).epsilon)
        excluded[p] = max(0.0, left)
    if len(included) < quorum:
        message = quorum_refusal(
            accounting,
            delta,
            len(included),
            names,
            quorum,
            queries,
            excluded,
            costs,
            standing,
            allowance,
        )
        raise QuorumError(message, excluded)
    return Admission(tuple(included), excluded)


def quorum_refusal(
    accounting: Accounting,
    delta: float,
    included: int,
    names: list[str],
    quorum: int,
    queries: int,
    excluded: Mapping[str, float],
    costs: Mapping[str, FloatArray],
    standing: Mapping[str, Standing],
    allowance: float | None = None,
) -> str:
    """Why a round of ``queries`` queries is refused: per excluded party, the epsilon it
    has left, what this round alone costs it (epsilon at ``delta``) and how many more
    queries its cap (and the querier's ``allowance`` on it, if any) covers; and where to
    see more."""
    fits: dict[str, int] = {}
    parts = []
    for p, left in excluded.items():
        alone = accounting.spent(costs[p], delta).epsilon
        s = standing[p]
        # Loss vectors add up over queries (Gaussian DP's mu**2, Renyi curves), so a
        # round's worst case over its size is one query's.
        unit = costs[p] / queries
        fits[p] = (
            accounting.max_count_of(unit, s.cap, delta, s.loss)
            if left > 0 and s.active and unit.any()
            else 0
        )
        if allowance is not None and fits[p] > 0:
            # The count the reservation admits: the allowance's rest binds as the cap does.
            held = accounting.zero() if s.querier_loss is None else s.querier_loss
            fits[p] = min(fits[p], accounting.max_count_of(unit, allowance, delta, held))
        parts.append(
            f"{p}: {left:.4g} eps left, this round of {queries} queries costs it "
            f"{alone:.4g} eps, {fits[p]} more queries fit"
        )
    best = max(fits, key=lambda p: fits[p]) if fits else None
    if best is None or fits[best] == 0:
        hint = ". No excluded party's cap covers another query"
    else:
        hint = (
            f"; at most {fits[best]} more queries fit ({best}): ask for at most that "
            "many per round (--batch-size)"
        )
    return (
        f"only {included} of {len(names)} parties can afford this round, quorum is "
        f"{quorum}; excluded: {'; '.join(parts)}{hint}. `capcctl budget` shows every "
        "party's epsilon and queries left"
    )


__all__ = ["Admission", "Standing", "check_round", "decide", "quorum_refusal"]
