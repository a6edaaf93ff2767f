"""Shared plumbing of the per-label multi-label mechanisms (Binary and tau voting).

Label j of a query is 1 iff c_j + n_j >= theta, theta half the voters' total
weight; with a confidence test (sigma1 > 0) it is released only if
|c_j - theta| + n1_j >= threshold. Noise is drawn per label. A query releases
m of its k decisions; the released vector has the L2 sensitivity
:meth:`PerLabelMechanism.sensitivity` (m), and the test sees all k labels.
"""

from __future__ import annotations

from abc import abstractmethod
from collections import Counter

import numpy as np
from numpy.typing import ArrayLike, NDArray

from capc.mechanisms.base import (
    NOT_ANSWERED,
    CircuitSpec,
    Labels,
    MechanismError,
    Noise,
    NoisyMechanism,
    gaussian_noise,
)
from capc.mpc.mechanism_circuits import CIRCUIT_FRAC_BITS, MultiLabelCircuit
from capc.mpc.ring import U64
from capc.privacy import events
from capc.privacy.randomness import SecureRandom


def label_matrix(predictions: ArrayLike, labels: int, name: str) -> NDArray[np.float64]:
    """0/1 label predictions (B, k) as floats; refuses any other shape or value."""
    p = np.asarray(predictions)
    if p.ndim != 2 or p.shape[1] != labels or not np.isin(p, (0, 1)).all():
        raise MechanismError(
            f"{name} votes need 0/1 label predictions of shape (B, {labels}), got {p.dtype} {p.shape}"
        )
    return p.astype(np.float64)


class PerLabelMechanism(NoisyMechanism):
    multi_label = True
    max_outputs = 64

    @property
    def per_label(self) -> bool:
        return True

    @abstractmethod
    def sensitivity(self, released: int) -> float:
        """L2 sensitivity of ``released`` of one query's per-label counts."""

    def circuit(
        self,
        max_votes: float,
        vote_total: float | None = None,
        share_frac_bits: int = 0,
        vote_parties: int = 0,
    ) -> CircuitSpec:
        if vote_parties:
            raise MechanismError(
                f"{self.name} votes are checked by validity proofs, not in the circuit"
            )
        total = max_votes if vote_total is None else vote_total
        return MultiLabelCircuit(
            num_labels=self.outputs,
            max_votes=max_votes,
            sigma=self.sigma,
            decision_threshold=total / 2.0,
            confidence_threshold=self.threshold if self.confident else None,
            sigma1=self.sigma1 if self.confident else 1.0,
            frac_bits=max(CIRCUIT_FRAC_BITS, share_frac_bits),
            share_frac_bits=share_frac_bits,
        )

    def draw_noise(self, batch: int, rng: SecureRandom) -> Noise:
        shape = (batch, self.outputs)
        noise = {"noise": gaussian_noise(shape, self.sigma, rng)}
        if self.confident:
            noise["confidence"] = gaussian_noise(shape, self.sigma1, rng)
        return noise

    def garbler_inputs(
        self,
        spec: CircuitSpec,
        guardian_sum: ArrayLike,
        noise: Noise,
        decision_threshold: ArrayLike | None = None,
        vote_total: ArrayLike | None = None,
    ) -> dict[str, U64]:
        if not isinstance(spec, MultiLabelCircuit):
            raise MechanismError(f"{self.name} runs the per-label circuit")
        return spec.garbler_inputs(
            guardian_sum, noise["noise"], noise.get("confidence"), decision_threshold
        )

    def decode(self, spec: CircuitSpec, evaluator_out: dict[str, U64]) -> Labels:
        if not isinstance(spec, MultiLabelCircuit):
            raise MechanismError(f"{self.name} runs the per-label circuit")
        return np.asarray(spec.decode(evaluator_out), dtype=np.int64)

    def decide(
        self, histograms: ArrayLike, noise: Noise, decision_threshold: ArrayLike | None = None
    ) -> tuple[Labels, NDArray[np.bool_]]:
        """``decision_threshold`` (votes): one for all queries, or (B,) one per query; required,
        since it is half the voters' total weight, which the histogram alone does not give."""
        c = np.asarray(histograms, dtype=np.float64)
        if decision_threshold is None:
            raise MechanismError("per-label decisions need the decision threshold (votes)")
        theta = np.asarray(decision_threshold, dtype=np.float64)
        if theta.shape == (c.shape[0],):
            theta = theta[:, None]
        elif theta.ndim != 0:
            raise MechanismError(
                f"decision_threshold must be a number or have shape ({c.shape[0]},), got {theta.shape}"
            )
        decided = (c + noise["noise"] >= theta).astype(np.int64)
        if not self.confident:
            return decided, np.ones(c.shape, dtype=bool)
        answered = np.abs(c - theta) + noise["confidence"] >= self.threshold
        return np.where(answered, decided, NOT_ANSWERED), answered

    def _event(self, answered: NDArray[np.bool_]) -> events.DpEvent:
        released = Counter(int(m) for m in answered.sum(axis=1))
        parts = [
            events.repeat(events.GaussianEvent(self.sensitivity(m), self.sigma), n)
            for m, n in sorted(released.items())
        ]
        if self.confident:
            parts.insert(
                0,
                events.repeat(
                    events.GaussianEvent(self.sensitivity(self.outputs), self.sigma1),
                    len(answered),
                ),
            )
        return events.compose(*parts)
