"""tau voting: Binary voting with each teacher's k-hot vote clipped to L2 norm tau.

Votes are non-negative with entries in [0, 1] and norm <= tau, so two votes a,
b satisfy |a - b|**2 <= 2 tau**2 and <= m on m released labels: sensitivity
min(sqrt(2) tau, sqrt(m)). Clipped votes are fractions: shares carry
fixed-point bits, and a party's validity proof holds its counts to that set:
each label's count in [0, teachers], their L2 norm at most teachers x tau
(:class:`capc.mpc.validity.VoteRelation`).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import Field

from capc.mechanisms.base import MAX_PARAMETER, NoisyParams
from capc.mechanisms.per_label import PerLabelMechanism, label_matrix


class TauParams(NoisyParams):
    sigma: float = Field(gt=0, le=MAX_PARAMETER, description="decision noise std (votes)")
    tau: float = Field(gt=0, le=MAX_PARAMETER, description="L2 clipping norm of one vote")
    threshold: float = Field(
        default=0.0, ge=0, le=MAX_PARAMETER, description="confidence threshold (votes)"
    )
    sigma1: float = Field(
        default=0.0, ge=0, le=MAX_PARAMETER, description="confidence-test noise std; 0: no test"
    )


class Tau(PerLabelMechanism):
    name = "tau"
    fractional_votes = True
    # A proof's statement grows with the grid (per label 2 x bits); 8 bits keep five
    # labels of a two-teacher party at 125 elements per query.
    vote_grid_bits = 8
    raisable = ("sigma", "threshold", "sigma1")
    params_model = TauParams

    params: TauParams

    @property
    def tau(self) -> float:
        return float(self.params.tau)

    def unit_votes(self, predictions: ArrayLike) -> NDArray[np.float64]:
        labels = label_matrix(predictions, self.outputs, self.name)
        norms = np.sqrt(labels.sum(axis=1, keepdims=True))
        return np.asarray(labels * np.minimum(1.0, self.tau / np.maximum(norms, 1.0)))

    def vote_norm(self) -> float:
        return self.tau

    def sensitivity(self, released: int) -> float:
        return min(math.sqrt(2.0) * self.tau, math.sqrt(released))
