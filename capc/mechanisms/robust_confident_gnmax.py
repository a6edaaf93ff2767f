"""Confident-GNMax with independent test noise on every class (offset-robust).

A query is answered iff max_j (h_j + eta1_j) >= threshold, eta1_j ~ N(0,
sigma1**2) drawn independently per class; the answer is argmax(h + eta2) as
in Confident-GNMax. The test then releases a post-processing of the noised
histogram h + eta1, a Gaussian mechanism of L2 sensitivity sqrt(2) (one
teacher moves two counts), so whatever offset a deviating party adds to h,
the test stays a Gaussian mechanism on the honest counts. With one shared
test noise, an offset can turn the test into a noiseless comparison of two
counts.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special
from numpy.typing import ArrayLike

from capc.mechanisms.base import MechanismError
from capc.mechanisms.confident_gnmax import ConfidentGNMax
from capc.privacy import events


class RobustConfidentGNMax(ConfidentGNMax):
    name = "robust-confident-gnmax"
    test_noise_per_class = True
    test_sensitivity = math.sqrt(2.0)

    def data_dependent_event(
        self, histogram: ArrayLike, answered: bool, orders: ArrayLike
    ) -> events.RdpCurveEvent:
        raise MechanismError(f"no data-dependent analysis of {self.name}")

    def log_pr_answered(self, histogram: ArrayLike) -> float:
        # Not answered iff every class stays below the threshold: prod_j Phi((T - h_j) / sigma1).
        h = np.asarray(histogram, dtype=np.float64)
        log_none = float(scipy.special.log_ndtr((self.threshold - h) / self.sigma1).sum())
        return float(np.log(-np.expm1(log_none))) if log_none < 0 else -math.inf
