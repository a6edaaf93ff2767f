"""Additive secret sharing in Z_2^64 and fixed-point encoding.

A vote vector v (integers, or reals in fixed point) is split into a student
share expanded from a fresh 128-bit seed and a guardian share v - student
share, all modulo 2^64 in numpy ``uint64`` (whose arithmetic wraps exactly
like the ring). Either share alone is uniform and independent of v; the sum of
many parties' shares reconstructs the sum of their votes.

Circuits work modulo 2^l for a small l: reduction mod 2^l is a ring
homomorphism, so each party reduces its own share sum locally.
"""

from __future__ import annotations

import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import ArrayLike, NDArray

U64 = NDArray[np.uint64]

#: Fractional bits of the fixed-point encoding unless a task says otherwise.
DEFAULT_FRAC_BITS = 16
#: Seeds are 128 bits: one AES-128 key each.
SEED_BYTES = 16


def round_half_up(scaled: ArrayLike) -> NDArray[np.float64]:
    """floor(s + 1/2) of float64 values ``s``, exactly: the nearest integer, ties upward.

    Unlike half-to-even rounding it commutes with integer shifts, round(k + s) =
    k + round(s) for every integer k, so rounding the guardian's noise eta alone and
    adding a count h on the grid gives round(h + eta), what the privacy statement
    rounds (half-to-even breaks it for an odd h whenever eta lies on a half).
    """
    s = np.asarray(scaled, dtype=np.float64)
    # From 2**52 on a float64 is an integer and s + 1/2 would itself be rounded.
    return np.where(np.abs(s) < 2.0**52, np.floor(s + 0.5), s)


def encode_fixed(values: ArrayLike, frac_bits: int = DEFAULT_FRAC_BITS) -> U64:
    """Encode reals as round(x * 2**frac_bits) in two's complement modulo 2^64, rounding
    ties upward (:func:`round_half_up`: the encoding commutes with adding grid values).

    Shape is preserved. Raises ``ValueError`` on NaN, infinity, or magnitudes
    that do not fit in 62 integer-plus-fraction bits.
    """
    x = np.asarray(values, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ValueError("cannot encode NaN or infinite values in fixed point")
    if not 0 <= frac_bits <= 40:
        raise ValueError(f"frac_bits must lie in [0, 40], got {frac_bits}")
    scaled = round_half_up(x * float(1 << frac_bits))
    if (np.abs(scaled) >= 2.0**62).any():
        raise ValueError(
            f"values up to {np.abs(x).max():g} do not fit in fixed point with {frac_bits} fractional bits"
        )
    return scaled.astype(np.int64).view(np.uint64)


def decode_fixed(
    values: ArrayLike, frac_bits: int = DEFAULT_FRAC_BITS, bits: int = 64
) -> NDArray[np.float64]:
    """Decode two's complement fixed point modulo 2^bits back to reals; same shape."""
    signed = to_signed(values, bits)
    return signed.astype(np.float64) / float(1 << frac_bits)


def reduce(values: ArrayLike, bits: int) -> U64:
    """Reduce ring elements modulo 2^bits (1 <= bits <= 64); same shape."""
    if not 1 <= bits <= 64:
        raise ValueError(f"bits must lie in [1, 64], got {bits}")
    x = np.asarray(values, dtype=np.uint64)
    if bits == 64:
        return x.copy()
    return x & np.uint64((1 << bits) - 1)


def to_signed(values: ArrayLike, bits: int) -> NDArray[np.int64]:
    """Interpret elements of Z_2^bits as two's complement integers; same shape."""
    x = reduce(values, bits)
    if bits == 64:
        return x.view(np.int64)
    top = np.uint64(1 << (bits - 1))
    return (x ^ top).astype(np.int64) - np.int64(1 << (bits - 1))


def expand_seed(seed: bytes, shape: int | tuple[int, ...]) -> U64:
    """Expand a 128-bit seed into uniform ring elements of ``shape`` with AES-128-CTR."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"share seeds are {SEED_BYTES} bytes, got {len(seed)}")
    size = int(np.prod(shape))
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(enc.update(bytes(8 * size)), dtype="<u8").astype(np.uint64).reshape(shape)


def new_seed() -> bytes:
    """A fresh 128-bit seed from the operating system's CSPRNG."""
    return os.urandom(SEED_BYTES)


def share(values: ArrayLike, seed: bytes) -> U64:
    """The guardian share of ``values`` (uint64 ring elements) for a given student seed.

    ``values - expand_seed(seed)`` modulo 2^64; the student share is
    ``expand_seed(seed, values.shape)``. Same shape as ``values``.
    """
    v = np.asarray(values)
    if v.dtype != np.uint64:
        raise ValueError(f"shares are taken of uint64 ring elements, got {v.dtype}; encode first")
    return v - expand_seed(seed, v.shape)


def reconstruct(*shares: ArrayLike) -> U64:
    """Sum shares modulo 2^64 (all of one shape)."""
    if not shares:
        raise ValueError("reconstruct needs at least one share")
    total = np.zeros(np.shape(shares[0]), dtype=np.uint64)
    for s in shares:
        arr = np.asarray(s, dtype=np.uint64)
        if arr.shape != total.shape:
            raise ValueError(f"shares have different shapes: {arr.shape} vs {total.shape}")
        total += arr
    return total


def sum_shares(shares: ArrayLike) -> U64:
    """Sum a stack of shares over its first axis modulo 2^64: (parties, ...) -> (...)."""
    arr = np.asarray(shares, dtype=np.uint64)
    if arr.ndim < 1:
        raise ValueError("sum_shares needs a stack of shares (parties, ...)")
    return np.asarray(arr.sum(axis=0, dtype=np.uint64), dtype=np.uint64)
