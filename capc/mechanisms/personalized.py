"""Personalized budgets as modifiers of any mechanism (Boenisch et al. 2023).

- ``weighting``: a party's vote counts w times; its sensitivity, hence its
  cost, scales by w (events scaled by w), so parties with larger caps weigh more.
- ``vanishing``: a party votes on each query with probability p (drawn by the
  guardian's secure randomness, never from data) and is charged only for the
  queries it voted on. No amplification by subsampling is claimed.

Both are functions of the parties' caps and the accountant, so every party
reaches its cap after about ``planned_queries`` queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from capc.mechanisms.base import Mechanism, MechanismError
from capc.privacy.accountants import Accounting
from capc.privacy.randomness import SecureRandom


class Personalization(BaseModel):
    """A task's personalized-budget modifier. ``max_weight`` bounds any vote weight
    (it sizes the circuit)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    mode: Literal["weighting", "vanishing"]
    planned_queries: int = Field(default=1000, ge=1, le=10**9)
    max_weight: float = Field(default=4.0, ge=1.0, le=64.0)

    @property
    def weighting(self) -> bool:
        return self.mode == "weighting"

    def multipliers(
        self, caps: Sequence[float], mechanism: Mechanism, accounting: Accounting, delta: float
    ) -> NDArray[np.float64]:
        """Per cap (epsilon at ``delta``), how many times one query's cost it affords over
        ``planned_queries`` queries."""
        unit = mechanism.per_query()
        return np.array(
            [
                accounting.max_multiplier(unit, self.planned_queries, max(float(c), 1e-12), delta)
                for c in caps
            ]
        )

    def weights(
        self,
        caps: Sequence[float],
        mechanism: Mechanism,
        accounting: Accounting,
        delta: float,
        frac_bits: int,
    ) -> NDArray[np.float64]:
        """Vote weights (weighting; mean 1 before the cap), rounded down to the shares'
        fixed-point grid so a party is charged for exactly the weight it votes with."""
        if not self.weighting:
            return np.ones(len(caps))
        # A weight w multiplies a Gaussian mechanism's cost by w**2, so w is proportional
        # to the square root of what each cap affords; mean 1 keeps the histogram's scale
        # (the noise and thresholds of the task stay meaningful), and the cap only slows
        # a party's spending.
        root = np.sqrt(self.multipliers(caps, mechanism, accounting, delta))
        if not root.any():
            return np.zeros_like(root)
        w = np.minimum(root / root.mean(), self.max_weight)
        grid = float(1 << frac_bits)
        return np.asarray(np.floor(w * grid) / grid, dtype=np.float64)

    def rates(
        self, caps: Sequence[float], mechanism: Mechanism, accounting: Accounting, delta: float
    ) -> NDArray[np.float64]:
        """Participation rates (vanishing; the largest is 1)."""
        if self.weighting:
            return np.ones(len(caps))
        # Proportional to what each cap affords, so every party is expected to reach its
        # cap after the same number of queries.
        mult = self.multipliers(caps, mechanism, accounting, delta)
        top = float(mult.max()) if mult.size else 0.0
        return mult / top if top > 0 else np.zeros_like(mult)

    @staticmethod
    def participation(rates: Sequence[float], queries: int, rng: SecureRandom) -> NDArray[np.bool_]:
        """Who votes on which query (vanishing): (parties,) rates in [0, 1] ->
        (queries, parties) mask, drawn from the guardian's secure randomness, never
        from data."""
        p = np.asarray(rates, dtype=np.float64)
        if p.ndim != 1 or not np.isfinite(p).all() or ((p < 0) | (p > 1)).any():
            raise MechanismError(
                "participation rates must be a 1-D array of probabilities in [0, 1]"
            )
        return rng.uniform((queries, p.size)) < p
