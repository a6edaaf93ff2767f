"""Binary voting: a per-label noisy majority over k-hot votes.

Each label's positive count moves by at most one between neighbours, all k
of them at once: m released decisions have L2 sensitivity sqrt(m).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import Field

from capc.mechanisms.base import MAX_PARAMETER, NoisyParams
from capc.mechanisms.per_label import PerLabelMechanism, label_matrix


class BinaryParams(NoisyParams):
    sigma: float = Field(gt=0, le=MAX_PARAMETER, description="decision noise std (votes)")
    threshold: float = Field(
        default=0.0, ge=0, le=MAX_PARAMETER, description="confidence threshold (votes)"
    )
    sigma1: float = Field(
        default=0.0, ge=0, le=MAX_PARAMETER, description="confidence-test noise std; 0: no test"
    )


class Binary(PerLabelMechanism):
    name = "binary"
    raisable = ("sigma", "threshold", "sigma1")
    params_model = BinaryParams

    def unit_votes(self, predictions: ArrayLike) -> NDArray[np.float64]:
        return label_matrix(predictions, self.outputs, self.name)

    def sensitivity(self, released: int) -> float:
        return math.sqrt(released)
