"""Shared plumbing of the mechanisms that release one noisy argmax per query.

GNMax, Confident-GNMax (either test) and Powerset voting all run the same
circuit (:class:`capc.mpc.mechanism_circuits.ConfidentGNMaxCircuit`) over their vote
columns; they differ in their parameters, their test noise and their cost.
"""

from __future__ import annotations

import math
from abc import abstractmethod

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
from capc.mpc.mechanism_circuits import CIRCUIT_FRAC_BITS, ConfidentGNMaxCircuit, MultiLabelCircuit
from capc.mpc.ring import U64
from capc.privacy import exact_noise
from capc.privacy import validation as check
from capc.privacy.randomness import SecureRandom

#: Grid points per vote on which LNMax adds its discrete Laplace noise.
LAPLACE_RESOLUTION = 256


def noisy_argmax(histograms: ArrayLike, noise: ArrayLike) -> Labels:
    """argmax(h + noise) per query: (queries, classes) votes -> (queries,) classes.

    Ties go to the lowest class index, as in the circuit."""
    h = check.histograms(histograms)
    n = np.asarray(noise, dtype=np.float64)
    if n.shape != h.shape:
        raise MechanismError(f"noise must have the histograms' shape {h.shape}, got {n.shape}")
    if not np.isfinite(n).all():
        raise MechanismError("noise must be finite")
    return np.asarray(np.argmax(h + n, axis=1), dtype=np.int64)


def laplace_noisy_max(histograms: ArrayLike, scale: float, rng: SecureRandom) -> Labels:
    """LNMax (Papernot et al. 2017): argmax of the counts (queries, classes) plus Laplace
    noise of ``scale`` (votes), released exactly as pure (2 / scale)-DP: (queries,) classes.

    The counts go on a grid of s = ``LAPLACE_RESOLUTION`` points per vote, rounded down
    (k = floor(s h)), and get independent exact discrete Laplace noise of integer scale
    t = ceil(s * scale) grid points (:mod:`capc.privacy.exact_noise`). A vote of weight
    at most 1 moves two counts by at most s points each, so the noisy vector k + Z is
    already (2 s / t)-DP, and (2 s / t) <= 2 / scale; the argmax is post-processing (ties
    to the lowest class). A float Laplace sampler has no such guarantee: its outputs are
    bounded (about 37.4 scales) and sparse. A library function for central analyses (no
    service runs pure-DP noisy max; ``capc.planning.cli --mechanism laplace`` prices it)."""
    h = check.histograms(histograms)
    b = check.positive(scale, "scale")
    s = LAPLACE_RESOLUTION
    k = np.floor(h * s)
    t = math.ceil(b * s)
    if np.abs(k).max(initial=0) + 64 * t > 2**62:
        raise MechanismError(
            f"counts up to {np.abs(h).max()} at scale {b} overflow LNMax's integer grid "
            f"({s} points per vote): use smaller counts or a smaller scale"
        )
    z = exact_noise.discrete_laplace(t, h.shape, rng)
    return np.asarray(np.argmax(k.astype(np.int64) + z, axis=1), dtype=np.int64)


class ArgmaxMechanism(NoisyMechanism):
    """A noisy argmax over the vote columns, optionally behind a noisy threshold test."""

    #: True when the threshold test draws independent noise on every class.
    test_noise_per_class = False

    @property
    def offset_robust(self) -> bool:
        # One test noise shared by every class: an offset on one class turns "answered"
        # into a noiseless comparison of two counts.
        return not self.confident or self.test_noise_per_class

    def circuit(
        self,
        max_votes: float,
        vote_total: float | None = None,
        share_frac_bits: int = 0,
        vote_parties: int = 0,
    ) -> CircuitSpec:
        return ConfidentGNMaxCircuit(
            num_classes=self.vote_width,
            max_votes=max_votes,
            sigma=self.sigma,
            threshold=self.threshold,
            sigma1=self.sigma1 if self.confident else 1.0,
            confident=self.confident,
            frac_bits=max(CIRCUIT_FRAC_BITS, share_frac_bits),
            share_frac_bits=share_frac_bits,
            vote_parties=vote_parties,
        )

    def draw_noise(self, batch: int, rng: SecureRandom) -> Noise:
        # Answer noise first, then the test's: the order a replaying test follows.
        noise = {"eta2": gaussian_noise((batch, self.vote_width), self.sigma, rng)}
        if self.confident:
            shape = (batch, self.vote_width) if self.test_noise_per_class else (batch,)
            noise["eta1"] = gaussian_noise(shape, self.sigma1, rng)
        return noise

    def garbler_inputs(
        self,
        spec: CircuitSpec,
        guardian_sum: ArrayLike,
        noise: Noise,
        decision_threshold: ArrayLike | None = None,
        vote_total: ArrayLike | None = None,
    ) -> dict[str, U64]:
        if not isinstance(spec, ConfidentGNMaxCircuit) or decision_threshold is not None:
            raise MechanismError(
                f"{self.name} runs the argmax circuit and takes no decision threshold"
            )
        return spec.garbler_inputs(guardian_sum, noise["eta2"], noise.get("eta1"), vote_total)

    def _decoded(self, spec: CircuitSpec, evaluator_out: dict[str, U64]) -> Labels:
        if isinstance(spec, MultiLabelCircuit):
            raise MechanismError(f"{self.name} runs the argmax circuit")
        return np.asarray(spec.decode(evaluator_out), dtype=np.int64)

    def decode(self, spec: CircuitSpec, evaluator_out: dict[str, U64]) -> Labels:
        return self._decoded(spec, evaluator_out)

    def decide(
        self, histograms: ArrayLike, noise: Noise, decision_threshold: ArrayLike | None = None
    ) -> tuple[Labels, NDArray[np.bool_]]:
        h = np.asarray(histograms, dtype=np.float64)
        labels = noisy_argmax(h, noise["eta2"])
        if not self.confident:
            return labels, np.ones(len(h), dtype=bool)
        eta1 = np.asarray(noise["eta1"], dtype=np.float64)
        want = h.shape if self.test_noise_per_class else h.shape[:1]
        if eta1.shape != want:
            raise MechanismError(
                f"{self.name}: the test noise eta1 must have shape {want}, got {eta1.shape}"
            )
        tested = (h + eta1).max(axis=1) if eta1.ndim == 2 else h.max(axis=1) + eta1
        answered = tested >= self.threshold
        return np.where(answered, labels, NOT_ANSWERED).astype(np.int64), answered

    @abstractmethod
    def unit_votes(self, predictions: ArrayLike) -> NDArray[np.float64]: ...
