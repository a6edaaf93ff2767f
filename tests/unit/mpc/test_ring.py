"""Secret sharing in Z_2^64 and fixed point."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from capc.mpc import ring


def test_fixed_point_round_trip_and_negative_values() -> None:
    x = np.array([0.0, 1.5, -2.25, 1e6, -1e-5, 123.456])
    enc = ring.encode_fixed(x, 16)
    assert enc.dtype == np.uint64
    np.testing.assert_allclose(ring.decode_fixed(enc, 16), x, atol=2**-17)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_fixed_point_rejects_non_finite(bad: float) -> None:
    with pytest.raises(ValueError, match="NaN or infinite"):
        ring.encode_fixed([1.0, bad])


def test_fixed_point_rejects_overflow() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        ring.encode_fixed([2.0**50], 16)


def test_shares_reconstruct_with_wrap_around() -> None:
    votes = np.array([[0, 1, 0], [1, 0, 0]], dtype=np.uint64)
    seeds = [ring.new_seed() for _ in range(5)]
    guardian = ring.sum_shares([ring.share(votes, s) for s in seeds])
    student = ring.sum_shares([ring.expand_seed(s, votes.shape) for s in seeds])
    np.testing.assert_array_equal(ring.reconstruct(guardian, student), 5 * votes)
    # A vote near the top of the ring still comes back exactly.
    big = np.array([2**64 - 1, 2**63], dtype=np.uint64)
    seed = ring.new_seed()
    np.testing.assert_array_equal(
        ring.reconstruct(ring.share(big, seed), ring.expand_seed(seed, 2)), big
    )


def test_reduction_is_a_homomorphism() -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2**64 - 1, 1000, dtype=np.uint64, endpoint=True)
    b = rng.integers(0, 2**64 - 1, 1000, dtype=np.uint64, endpoint=True)
    for bits in (1, 15, 33, 63, 64):
        np.testing.assert_array_equal(
            ring.reduce(a + b, bits), ring.reduce(ring.reduce(a, bits) + ring.reduce(b, bits), bits)
        )


def test_to_signed() -> None:
    np.testing.assert_array_equal(
        ring.to_signed(np.array([0, 1, 2**14, 2**15 - 1], dtype=np.uint64), 15),
        [0, 1, -(2**14), -1],
    )


def test_seed_expansion_is_deterministic_and_seed_dependent() -> None:
    s = bytes(16)
    np.testing.assert_array_equal(ring.expand_seed(s, (4, 3)), ring.expand_seed(s, (4, 3)))
    assert not np.array_equal(ring.expand_seed(s, 8), ring.expand_seed(bytes(15) + b"\x01", 8))
    with pytest.raises(ValueError, match="16 bytes"):
        ring.expand_seed(b"short", 3)


def test_share_requires_encoded_values() -> None:
    with pytest.raises(ValueError, match="uint64"):
        ring.share(np.array([1.0, 0.0]), ring.new_seed())


@pytest.mark.parametrize("which", ["guardian", "student"])
def test_each_share_alone_is_uniform(which: str) -> None:
    """A fixed, highly structured vote must give shares whose bytes are uniform (chi-square)."""
    votes = np.zeros((4096, 10), dtype=np.uint64)
    votes[:, 3] = 1
    seeds = [ring.new_seed() for _ in range(4)]
    shares = (
        ring.sum_shares([ring.share(votes, s) for s in seeds])
        if which == "guardian"
        else ring.sum_shares([ring.expand_seed(s, votes.shape) for s in seeds])
    )
    counts = np.bincount(shares.view(np.uint8).ravel(), minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-4
    # Every bit position, including the low bits that carry the vote, is balanced.
    bits = (shares.ravel()[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    freq = bits.mean(axis=0)
    n = shares.size
    assert np.all(np.abs(freq - 0.5) < 5 * 0.5 / np.sqrt(n))
