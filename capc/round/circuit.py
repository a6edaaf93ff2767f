"""The guardian's inputs to a round's garbled circuit (a pure function of the round and
the guardian's randomness)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from capc.mechanisms.base import CircuitSpec, Noise
from capc.privacy.randomness import SecureRandom
from capc.round.errors import RoundRefusedError
from capc.round.state import RoundView, TaskT


@dataclass(frozen=True)
class RoundCircuit:
    """What a round's circuit is and holds the histogram to: ``spec``; ``theta`` (B,) the
    per-label decision threshold under vanishing (None: the mechanism's own); and
    ``vote_total`` (B,) each query's total vote weight (votes)."""

    spec: CircuitSpec
    theta: NDArray[np.float64] | None
    vote_total: NDArray[np.float64]


def round_circuit(rnd: RoundView[TaskT]) -> RoundCircuit:
    """The circuit for ``rnd``'s parties (public sizes and weights only)."""
    task, mech = rnd.task, rnd.task.mechanism
    # A party with m teachers adds m votes (times its weight) to every query.
    total = sum(rnd.voters(p) * rnd.weight(p) for p in rnd.used)
    filtered = len(rnd.used) if rnd.ciphertext_hash is not None else 0
    spec = task.circuit_spec(sum(rnd.voters(p) for p in rnd.used), total, filtered)
    theta = None
    if rnd.votes_on and mech.per_label:  # vanishing: the majority of the teachers who voted
        theta = np.sum([rnd.voters(p) * rnd.voting(p) for p in rnd.used], axis=0) / 2.0
    vote_total = np.sum(
        [rnd.voters(p) * rnd.weight(p) * rnd.voting(p) for p in rnd.used], axis=0
    ).astype(np.float64)
    return RoundCircuit(spec, theta, vote_total)


def draw_noise(rnd: RoundView[TaskT], rng: SecureRandom) -> Noise:
    """The guardian's fresh noise for ``rnd``, from ``rng`` (the mechanism's order)."""
    return rnd.task.mechanism.draw_noise(rnd.batch, rng)


def garbler_inputs(
    rnd: RoundView[TaskT], rng: SecureRandom, noise: Noise | None = None
) -> tuple[CircuitSpec, dict[str, NDArray[np.uint64]]]:
    """The circuit for ``rnd``'s parties and the guardian's inputs: its share sum, fresh noise
    (``noise``, drawn for this round alone, or drawn now from ``rng``), and every query's
    vote total (what the histogram checks hold it to)."""
    if rnd.guardian_sum is None:
        raise RoundRefusedError(f"round {rnd.round_id} has no share sum to compute on")
    plan = round_circuit(rnd)
    if noise is None:
        noise = draw_noise(rnd, rng)
    inputs = rnd.task.mechanism.garbler_inputs(
        plan.spec, rnd.guardian_sum, noise, plan.theta, plan.vote_total
    )
    return plan.spec, inputs


__all__ = ["RoundCircuit", "draw_noise", "garbler_inputs", "round_circuit"]
