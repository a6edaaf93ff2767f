"""Powerset voting: GNMax over the 2**k label subsets a teacher can vote for.

A teacher's k-bit vote is one subset (index sum_j bit_j 2**j), so a vote
change still moves two counts by one: L2 sensitivity sqrt(2). With sigma1 > 0
a threshold test comes first (confident Powerset voting): answered iff
max_j (h_j + eta1_j) >= threshold, with independent test noise on every
subset count (sensitivity sqrt(2)), so that an offset a deviating party adds
cannot make the test noiseless. Only for small k: the circuit has 2**k columns.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import Field

from capc.mechanisms.argmax import ArgmaxMechanism
from capc.mechanisms.base import (
    MAX_PARAMETER,
    NOT_ANSWERED,
    CircuitSpec,
    Labels,
    MechanismError,
    NoisyParams,
)
from capc.mpc.ring import U64
from capc.mpc.validity import max_width
from capc.onehot import one_hot
from capc.privacy import events

#: Labels Powerset voting takes, in every path (plain, secure, advisor): the most k whose
#: 2**k subset counts a party's vote-validity statement covers at one teacher
#: (:func:`capc.mpc.validity.max_width`: 2**9 of the 512 elements per query). Without a
#: statement a hospital could skew the subset counts within the circuit's range checks and
#: decide labels, so larger k is refused rather than run unchecked (9 today; the circuit's
#: cost, 5.4 MB a query garbled at 2**10 subsets, would stop it near 10 anyway).
MAX_POWERSET_LABELS = max_width(1).bit_length() - 1


def subset_bits(index: ArrayLike, num_labels: int) -> Labels:
    """Decode subset indices (queries,) into k-bit label vectors (queries, k): bit j of
    subset ``sum_j bit_j * 2**j``."""
    idx = np.asarray(index, dtype=np.int64)
    return (idx[:, None] >> np.arange(num_labels, dtype=np.int64)) & 1


class PowersetParams(NoisyParams):
    sigma: float = Field(gt=0, le=MAX_PARAMETER, description="answer noise std (votes)")
    threshold: float = Field(default=0.0, ge=0, le=MAX_PARAMETER, description="threshold (votes)")
    sigma1: float = Field(
        default=0.0, ge=0, le=MAX_PARAMETER, description="threshold-test noise std; 0: no test"
    )


class Powerset(ArgmaxMechanism):
    name = "powerset"
    multi_label = True
    raisable = ("sigma", "threshold", "sigma1")
    max_outputs = MAX_POWERSET_LABELS
    max_outputs_why = (
        f"a vote-validity statement covers at most 2**{MAX_POWERSET_LABELS} subsets per query "
        "(MAX_POWERSET_LABELS), and without one a hospital could decide labels with an invalid "
        f"vote. Use at most {MAX_POWERSET_LABELS} labels, or split the labels into tasks of at "
        f"most {MAX_POWERSET_LABELS}"
    )
    params_model = PowersetParams
    test_noise_per_class = True

    def __init__(self, outputs: int, params: PowersetParams) -> None:
        super().__init__(outputs, params)
        if params.threshold and not params.sigma1:
            raise MechanismError("powerset: a threshold needs sigma1 > 0 for its test")

    @property
    def vote_width(self) -> int:
        return 1 << self.outputs

    def outputs_for_width(self, width: int) -> int:
        """The most labels whose 2**k subsets fit ``width`` columns."""
        return max(width.bit_length() - 1, 0)

    def unit_votes(self, predictions: ArrayLike) -> NDArray[np.float64]:
        p = np.asarray(predictions)
        if p.ndim != 2 or p.shape[1] != self.outputs or not np.isin(p, (0, 1)).all():
            raise MechanismError(
                f"powerset votes need 0/1 label predictions of shape (B, {self.outputs}), "
                f"got {p.dtype} {p.shape}"
            )
        index = (p.astype(np.int64) << np.arange(self.outputs, dtype=np.int64)).sum(axis=1)
        return one_hot(index, self.vote_width, what="predictions", error=MechanismError)

    def decode(self, spec: CircuitSpec, evaluator_out: dict[str, U64]) -> Labels:
        return self._bits(self._decoded(spec, evaluator_out))

    def _bits(self, raw: Labels) -> Labels:
        bits = subset_bits(np.maximum(raw, 0), self.outputs)
        return np.where((raw == NOT_ANSWERED)[:, None], NOT_ANSWERED, bits)

    def decide(
        self,
        histograms: ArrayLike,
        noise: dict[str, NDArray[np.float64]],
        decision_threshold: ArrayLike | None = None,
    ) -> tuple[Labels, NDArray[np.bool_]]:
        raw, answered = super().decide(histograms, noise, decision_threshold)
        return self._bits(raw), answered

    def _event(self, answered: NDArray[np.bool_]) -> events.DpEvent:
        test = (
            events.repeat(events.GaussianEvent(math.sqrt(2.0), self.sigma1), len(answered))
            if self.confident
            else events.NoOpEvent()
        )
        return events.compose(
            test,
            events.repeat(events.GaussianEvent(math.sqrt(2.0), self.sigma), int(answered.sum())),
        )
