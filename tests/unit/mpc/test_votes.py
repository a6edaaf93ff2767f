"""Vote shares from several parties reconstruct the histogram; a relayed seed cannot be moved."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mpc import ring
from capc.mpc.sealing import SealError
from capc.mpc.votes import one_hot_votes, share_votes, student_share_sum
from capc.privacy.mechanisms.single_label import vote_histogram


def test_shares_of_many_parties_sum_to_the_histogram() -> None:
    rng = np.random.default_rng(0)
    student = X25519PrivateKey.generate()
    pub = student.public_key().public_bytes_raw()
    preds = rng.integers(0, 10, (7, 64))
    guardian = np.zeros((64, 10), dtype=np.uint64)
    sealed = {}
    for i, p in enumerate(preds):
        share, box = share_votes(one_hot_votes(p, 10), pub, 3, f"h{i}")
        guardian += share
        sealed[f"h{i}"] = box
    hist = vote_histogram(preds.T, 10).astype(np.uint64)
    np.testing.assert_array_equal(
        ring.reconstruct(guardian, student_share_sum(student, sealed, 3, (64, 10))), hist
    )


def test_seed_moved_to_another_party_or_round_fails() -> None:
    student = X25519PrivateKey.generate()
    _, box = share_votes(
        one_hot_votes(np.array([1]), 3), student.public_key().public_bytes_raw(), 3, "h1"
    )
    with pytest.raises(SealError):
        student_share_sum(student, {"h2": box}, 3, (1, 3))
    with pytest.raises(SealError):
        student_share_sum(student, {"h1": box}, 4, (1, 3))


def test_bad_predictions() -> None:
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        one_hot_votes(np.array([3]), 3)
    with pytest.raises(ValueError, match="integer"):
        one_hot_votes(np.array([0.5]), 3)
    with pytest.raises(ValueError, match="uint64"):
        share_votes(
            np.ones((2, 2)), X25519PrivateKey.generate().public_key().public_bytes_raw(), 1, "h"
        )
