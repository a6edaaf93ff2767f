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

#: Mechanisms whose votes are one class per query.
SINGLE_LABEL = ("confident-gnmax", "gnmax")


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


def encode_votes(
    predictions: ArrayLike,
    mechanism: str,
    *,
    num_classes: int = 0,
    weight: float = 1.0,
    frac_bits: int = 0,
    tau: float = 0.0,
    participation: ArrayLike | None = None,
) -> U64:
    """A party's votes for ``mechanism``, in the ring with ``frac_bits`` fractional bits.

    ``predictions``: classes (B,) for single-label mechanisms, 0/1 labels
    (B, k) for multi-label ones. Returns (B, width) uint64 with width
    ``num_classes`` (single label), k (``binary``, ``tau``) or 2**k
    (``powerset``, one-hot over label subsets, index sum_j bit_j 2**j).
    ``tau`` clips each k-hot vector to l2 norm ``tau``. Every entry is scaled
    by ``weight`` and rounded *down* on the grid, so a vote never grows past
    its unrounded value and the sensitivity bounds of capc.privacy hold.
    ``participation`` (B,) bool: rows where the party sits out are all zero.
    """
    if not (np.isfinite(weight) and weight >= 0):
        raise ValueError(f"weight must be finite and >= 0, got {weight}")
    if not 0 <= frac_bits <= 24:
        raise ValueError(f"frac_bits must lie in [0, 24], got {frac_bits}")
    p = np.asarray(predictions)
    if mechanism in SINGLE_LABEL:
        if num_classes < 2:
            raise ValueError("single-label votes need num_classes >= 2")
        unit = one_hot_votes(p, num_classes).astype(np.float64)
    else:
        if p.ndim != 2 or not np.isin(p, (0, 1)).all():
            raise ValueError(
                f"{mechanism} votes need 0/1 label predictions of shape (B, k), got {p.dtype} {p.shape}"
            )
        labels = p.astype(np.float64)
        if mechanism == "binary":
            unit = labels
        elif mechanism == "tau":
            if not tau > 0:
                raise ValueError("tau voting needs tau > 0")
            norms = np.sqrt(labels.sum(axis=1, keepdims=True))
            unit = labels * np.minimum(1.0, tau / np.maximum(norms, 1.0))
        elif mechanism == "powerset":
            index = (p.astype(np.int64) << np.arange(p.shape[1], dtype=np.int64)).sum(axis=1)
            unit = one_hot_votes(index, 1 << p.shape[1]).astype(np.float64)
        else:
            raise ValueError(f"no vote encoding for mechanism {mechanism!r}")
    if participation is not None:
        mask = np.asarray(participation, dtype=bool)
        if mask.shape != (unit.shape[0],):
            raise ValueError(f"participation must have shape ({unit.shape[0]},), got {mask.shape}")
        unit = unit * mask[:, None]
    return np.floor(unit * (weight * (1 << frac_bits))).astype(np.uint64)


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
