"""GNMax (Papernot et al. 2018): the argmax of the vote histogram plus Gaussian noise.

Every query is answered. One teacher moving its vote changes two counts by
one, so each answer is a Gaussian mechanism of L2 sensitivity sqrt(2).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import Field

from capc.mechanisms.argmax import ArgmaxMechanism
from capc.mechanisms.base import MAX_PARAMETER, MechanismError, NoisyParams
from capc.onehot import one_hot
from capc.privacy import events, rdp


class GNMaxParams(NoisyParams):
    sigma: float = Field(gt=0, le=MAX_PARAMETER, description="answer noise std (votes)")


class GNMax(ArgmaxMechanism):
    name = "gnmax"
    raisable = ("sigma",)
    params_model = GNMaxParams

    def unit_votes(self, predictions: ArrayLike) -> NDArray[np.float64]:
        return one_hot(predictions, self.outputs, what="predictions", error=MechanismError)

    def data_dependent_event(
        self, histogram: ArrayLike, answered: bool, orders: ArrayLike
    ) -> events.RdpCurveEvent:
        o = np.asarray(orders, dtype=np.float64)
        curve = rdp.gnmax_data_dependent(histogram, self.sigma, o) if answered else np.zeros_like(o)
        return events.RdpCurveEvent(curve, o, self.name, data_dependent=True)

    def _event(self, answered: NDArray[np.bool_]) -> events.DpEvent:
        return events.repeat(events.GaussianEvent(math.sqrt(2.0), self.sigma), int(answered.sum()))
