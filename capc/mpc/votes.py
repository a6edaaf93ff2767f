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
from capc.mpc.sealing import open_sealed, seal, seed_context

U64 = NDArray[np.uint64]


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
    """Open every party's sealed seed for ``round_id`` and sum the expanded shares; shape ``shape``."""
    total = np.zeros(shape, dtype=np.uint64)
    for party, box in sorted(sealed.items()):
        total += ring.expand_seed(open_sealed(key, box, seed_context(round_id, party)), shape)
    return total
