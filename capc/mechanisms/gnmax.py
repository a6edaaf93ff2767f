"""GNMax (Papernot et al. 2018): the argmax of the vote histogram plus Gaussian noise.

Every query is answered. One teacher moving its vote changes two counts by
one, so each answer is a Gaussian mechanism of L2 sensitivity sqrt(2).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import Field

from capc.mechanisms.argmax import ArgmaxMechanism, one_hot
from capc.mechanisms.base import MAX_PARAMETER, Params
from capc.privacy import events


class GNMaxParams(Params):
    sigma: float = Field(gt=0, le=MAX_PARAMETER, description="answer noise std (votes)")


class GNMax(ArgmaxMechanism):
    name = "gnmax"
    raisable = ("sigma",)
    params_model = GNMaxParams

    def unit_votes(self, predictions: ArrayLike) -> NDArray[np.float64]:
        return one_hot(predictions, self.outputs)

    def _event(self, answered: NDArray[np.bool_]) -> events.DpEvent:
        return events.repeat(events.GaussianEvent(math.sqrt(2.0), self.sigma), int(answered.sum()))
