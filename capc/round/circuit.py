"""The guardian's inputs to a round's garbled circuit (a pure function of the round and
the guardian's randomness)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from capc.mechanisms.base import CircuitSpec
from capc.privacy.randomness import SecureRandom
from capc.round.errors import RoundRefusedError
from capc.round.state import GuardianRound, TaskT


def garbler_inputs(
    rnd: GuardianRound[TaskT], rng: SecureRandom
) -> tuple[CircuitSpec, dict[str, NDArray[np.uint64]]]:
    """The circuit for ``rnd``'s parties and the guardian's inputs: its share sum, fresh noise
    from ``rng``, and every query's vote total (what the histogram checks hold it to)."""
    if rnd.guardian_sum is None:
        raise RoundRefusedError(f"round {rnd.round_id} has no share sum to compute on")
    task, mech = rnd.task, rnd.task.mechanism
    # A party with m teachers adds m votes (times its weight) to every query.
    total = sum(rnd.voters(p) * rnd.weight(p) for p in rnd.used)
    filtered = len(rnd.used) if rnd.ciphertext_hash is not None else 0
    spec = task.circuit_spec(sum(rnd.voters(p) for p in rnd.used), total, filtered)
    noise = mech.draw_noise(rnd.batch, rng)
    theta = None
    if rnd.votes_on and mech.per_label:  # vanishing: the majority of the teachers who voted
        theta = np.sum([rnd.voters(p) * rnd.voting(p) for p in rnd.used], axis=0) / 2.0
    vote_total = np.sum(
        [rnd.voters(p) * rnd.weight(p) * rnd.voting(p) for p in rnd.used], axis=0
    ).astype(np.float64)
    return spec, mech.garbler_inputs(spec, rnd.guardian_sum, noise, theta, vote_total)


__all__ = ["garbler_inputs"]
