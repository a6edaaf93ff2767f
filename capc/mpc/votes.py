"""Vote shares as answering parties make them and the student opens them (design section 2, steps 3-5).

An answering party turns its predictions into votes, encodes them in the
ring, draws a fresh 128-bit seed, and sends the guardian ``votes - expand(seed)``
in the clear and the seed sealed to the student. The student opens every
sealed seed of the parties the guardian reports and sums the expansions.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import ArrayLike, NDArray

from capc.mpc import ring
from capc.mpc.sealing import SealError, open_sealed, seal, seed_context

U64 = NDArray[np.uint64]


class PartyInputError(ValueError):
    """One answering party's input to a round cannot be used; ``party`` names the party."""

    def __init__(self, party: str, round_id: int, reason: str) -> None:
        super().__init__(
            f"{party}'s input to round {round_id} cannot be used: {reason}. {party} deviated "
            f"from the protocol or its software is broken; ask its operator to check it"
        )
        self.party = party
        self.round_id = round_id


class UnopenableSeedError(PartyInputError, SealError):
    """A party's sealed seed does not open with the student's key."""


def one_hot_votes(predictions: ArrayLike, num_classes: int, weight: int = 1) -> U64:
    """Predicted classes (B,) -> one-hot votes (B, K) in the ring, ``weight`` per vote."""
    p = np.asarray(predictions)
    if p.ndim != 1 or not np.issubdtype(p.dtype, np.integer):
        raise ValueError(f"predictions must be a 1-D integer array, got {p.dtype} {p.shape}")
    if ((p < 0) | (p >= num_classes)).any():
        raise ValueError(f"predictions must lie in [0, {num_classes})")
    votes = np.zeros((p.size, num_classes), dtype=np.uint64)
    votes[np.arange(p.size), p] = np.uint64(weight)
    return votes


def share_votes(
    votes: ArrayLike, student_public_key: bytes, round_id: int, party: str
) -> tuple[U64, bytes]:
    """(guardian share, sealed seed) of ``votes`` (uint64 ring elements, any shape)."""
    v = np.asarray(votes)
    if v.dtype != np.uint64:
        raise ValueError(f"votes must be uint64 ring elements, got {v.dtype}; encode them first")
    seed = ring.new_seed()
    return ring.share(v, seed), seal(student_public_key, seed, seed_context(round_id, party))


def student_share_sum(
    key: X25519PrivateKey, sealed: Mapping[str, bytes], round_id: int, shape: tuple[int, ...]
) -> U64:
    """Open every party's sealed seed for ``round_id`` and sum the expanded shares; shape ``shape``.

    A seed that does not open raises :class:`UnopenableSeedError` naming its party.
    """
    total = np.zeros(shape, dtype=np.uint64)
    for party, box in sorted(sealed.items()):
        try:
            seed = open_sealed(key, box, seed_context(round_id, party))
        except SealError as err:
            raise UnopenableSeedError(party, round_id, f"its sealed seed: {err}") from None
        total += ring.expand_seed(seed, shape)
    return total
