"""Personalized budgets in a round: each party's vote weight (weighting) or the queries it
votes on (vanishing), functions of the caps and the guardian's randomness, never of
the data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from capc.mechanisms import Personalization
from capc.privacy.accountants import Accounting
from capc.privacy.randomness import SecureRandom
from capc.round.task import RoundTask


def rates(
    task: RoundTask,
    caps: Mapping[str, float],
    parties: Sequence[str],
    accounting: Accounting,
    delta: float,
) -> dict[str, tuple[float, float]]:
    """(vote weight, participation rate) of each of ``parties`` from its cap (0 when it has
    none); (1, 1) without personalization. Weights are rounded down to the shares' grid."""
    pers = task.personalization
    if pers is None or not parties:
        return {n: (1.0, 1.0) for n in parties}
    held = [caps.get(n, 0.0) for n in parties]
    w = pers.weights(held, task.mechanism, accounting, delta, task.weight_bits)
    p = pers.rates(held, task.mechanism, accounting, delta)
    return {n: (float(w[i]), float(p[i])) for i, n in enumerate(parties)}


def draw(
    task: RoundTask, rates: Mapping[str, tuple[float, float]], batch: int, rng: SecureRandom
) -> tuple[dict[str, float], dict[str, NDArray[np.bool_]]]:
    """One round's vote weights (weighting) or (batch,) participation masks (vanishing, drawn
    from ``rng``) for the parties of ``rates``; both empty without personalization."""
    parties = list(rates)
    if task.personalization is None or not parties:
        return {}, {}
    if task.weighting:
        return {p: rates[p][0] for p in parties}, {}
    mask = Personalization.participation([rates[p][1] for p in parties], batch, rng)
    return {}, {p: mask[:, i] for i, p in enumerate(parties)}


__all__ = ["draw", "rates"]
