"""Confident-GNMax (Papernot et al. 2018): a noisy threshold test, then GNMax.

A query is answered iff max(h) + eta1 >= threshold, with one test noise
eta1 ~ N(0, sigma1**2) per query; an answered query gets argmax(h + eta2),
eta2 ~ N(0, sigma**2) per class. The tested maximum moves by at most one
between neighbours (sensitivity 1), every test is charged, and answers are
charged where they were released.

Not offset-robust: with one test noise shared by every class, an offset that
a deviating student or hospital adds to the histogram can make "answered" a
noiseless comparison of two counts. Distributed rounds refuse it; use
robust-confident-gnmax (independent test noise per class) there.
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


class ConfidentGNMaxParams(NoisyParams):
    sigma: float = Field(gt=0, le=MAX_PARAMETER, description="answer noise std (votes)")
    threshold: float = Field(ge=0, le=MAX_PARAMETER, description="threshold T (votes)")
    sigma1: float = Field(gt=0, le=MAX_PARAMETER, description="threshold-test noise std (votes)")


class ConfidentGNMax(ArgmaxMechanism):
    name = "confident-gnmax"
    raisable = ("sigma", "threshold", "sigma1")
    params_model = ConfidentGNMaxParams
    #: L2 sensitivity of what the threshold test adds noise to.
    test_sensitivity = 1.0

    def unit_votes(self, predictions: ArrayLike) -> NDArray[np.float64]:
        return one_hot(predictions, self.outputs, what="predictions", error=MechanismError)

    def data_dependent_event(
        self, histogram: ArrayLike, answered: bool, orders: ArrayLike
    ) -> events.RdpCurveEvent:
        o = np.asarray(orders, dtype=np.float64)
        curve = rdp.threshold_data_dependent(histogram, self.threshold, self.sigma1, o)
        if answered:
            curve = curve + rdp.gnmax_data_dependent(histogram, self.sigma, o)
        return events.RdpCurveEvent(curve, o, self.name, data_dependent=True)

    def log_pr_answered(self, histogram: ArrayLike) -> float:
        return rdp.log_pr_answered(histogram, self.threshold, self.sigma1)

    def _event(self, answered: NDArray[np.bool_]) -> events.DpEvent:
        return events.compose(
            events.repeat(events.GaussianEvent(self.test_sensitivity, self.sigma1), len(answered)),
            events.repeat(events.GaussianEvent(math.sqrt(2.0), self.sigma), int(answered.sum())),
        )
