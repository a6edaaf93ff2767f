"""Arithmetic in GF(2^128) for the OT-extension consistency check.

Elements are polynomials over GF(2) modulo x^128 + x^7 + x^2 + x + 1 (the GCM
field). Two encodings are used:

- *words*: arrays of shape (..., 2) of uint64 (low, high); bit i of the
  128-bit integer low + 2^64 high is the coefficient of x^i. :func:`mul`
  works on these, vectorised over any leading shape.
- *GCM bytes*: 16-byte blocks as in NIST SP 800-38D, where the most
  significant bit of byte 0 is the coefficient of x^0. :func:`poly_hash`
  returns this encoding because it runs on OpenSSL's GHASH.

:func:`poly_hash` evaluates sum_i X_i H^(n + 2 - i) over n blocks X_i for a
key-dependent H. It is what the consistency check needs (a random GF(2^128)
linear combination of every row of the OT matrix) at GHASH speed: a per-row
multiplication in numpy would cost more than the whole OT extension.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from numpy.typing import NDArray

from capc.mpc.blocks import BLOCK_BYTES, Blocks

#: x^128 = x^7 + x^2 + x + 1 in the field.
_REDUCTION = (0, 1, 2, 7)
#: GHASH input per AES-GCM call: OpenSSL via `cryptography` takes at most 2^31 - 1 bytes.
MAX_GHASH_CHUNK = 1 << 30
_NONCE = bytes(12)
_SHIFTS = np.arange(64, dtype=np.uint64)[:, None]
_CLMUL_CHUNK = 1 << 14
# J0 for a 96-bit nonce: nonce || 0^31 || 1 (SP 800-38D, 7.1).
_J0 = _NONCE + (1).to_bytes(4, "big")
# Reversing the bits of every byte turns GCM bytes into little-endian words.
_BIT_REVERSE = np.array([int(f"{b:08b}"[::-1], 2) for b in range(256)], dtype=np.uint8)


def clmul64(a: NDArray[np.uint64], b: NDArray[np.uint64]) -> tuple[Blocks, Blocks]:
    """Carry-less products of uint64 arrays (broadcast): (low words, high words).

    All 64 shifted copies of ``a`` are formed at once and XOR-reduced, so the
    cost is a handful of numpy calls (64 words of scratch per element, in
    chunks of :data:`_CLMUL_CHUNK` elements).
    """
    shape = np.broadcast_shapes(a.shape, b.shape)
    af = np.broadcast_to(a, shape).astype(np.uint64).reshape(-1)
    bf = np.broadcast_to(b, shape).astype(np.uint64).reshape(-1)
    lo = np.empty(af.size, dtype=np.uint64)
    hi = np.empty(af.size, dtype=np.uint64)
    for start in range(0, af.size, _CLMUL_CHUNK):
        part = slice(start, start + _CLMUL_CHUNK)
        x, y = af[None, part], bf[None, part]
        mask = np.uint64(0) - ((y >> _SHIFTS) & np.uint64(1))  # (64, n): bit k of b, all ones
        lo[part] = np.bitwise_xor.reduce((x << _SHIFTS) & mask, axis=0)
        # a >> (64 - k), written so that k = 0 gives 0 (numpy has no defined shift by 64).
        hi[part] = np.bitwise_xor.reduce(((x >> np.uint64(1)) >> (63 - _SHIFTS)) & mask, axis=0)
    return lo.reshape(shape), hi.reshape(shape)


def mul(a: Blocks, b: Blocks) -> Blocks:
    """Products a * b in GF(2^128), word encoding; shapes (..., 2) broadcast."""
    a0, a1 = a[..., 0], a[..., 1]
    b0, b1 = b[..., 0], b[..., 1]
    # The four 64 x 64 products in one vectorised call: a0b0, a0b1, a1b0, a1b1.
    lo, hi = clmul64(
        np.stack(np.broadcast_arrays(a0, a0, a1, a1)), np.stack(np.broadcast_arrays(b0, b1, b0, b1))
    )
    p0 = lo[0]
    p1 = hi[0] ^ lo[1] ^ lo[2]
    p2 = hi[1] ^ hi[2] ^ lo[3]
    p3 = hi[3]
    # Fold the high half (p2, p3) * x^128 = (p2, p3) * (x^7 + x^2 + x + 1): up to 135 bits,
    # so its top 7 bits (w2, at x^128..x^134) are folded once more, into the low word.
    w0 = np.zeros_like(p0)
    w1 = np.zeros_like(p0)
    w2 = np.zeros_like(p0)
    for k in _REDUCTION:
        if k == 0:
            w0 ^= p2
            w1 ^= p3
            continue
        sk, rk = np.uint64(k), np.uint64(64 - k)
        w0 ^= p2 << sk
        w1 ^= (p3 << sk) | (p2 >> rk)
        w2 ^= p3 >> rk
    for k in _REDUCTION:
        w0 ^= w2 << np.uint64(k)
    return np.stack([p0 ^ w0, p1 ^ w1], axis=-1)


def power(a: Blocks, e: int) -> Blocks:
    """a^e in GF(2^128) for a non-negative integer e (square and multiply); shape (..., 2)."""
    if e < 0:
        raise ValueError(f"exponent must be non-negative, got {e}")
    result = np.zeros_like(a)
    result[..., 0] = 1
    base = a
    while e:
        if e & 1:
            result = mul(result, base)
        base = mul(base, base)
        e >>= 1
    return result


def from_gcm(data: bytes | NDArray[np.uint8]) -> Blocks:
    """GCM bytes to words: one 16-byte string gives (2,), an array (..., 16) gives (..., 2)."""
    raw = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
    if raw.shape[-1:] != (BLOCK_BYTES,):
        raise ValueError(f"GF(2^128) elements are 16 bytes each, got shape {raw.shape}")
    words = np.ascontiguousarray(_BIT_REVERSE[raw]).view("<u8")
    return words.astype(np.uint64)


def to_gcm(x: Blocks) -> NDArray[np.uint8]:
    """Words (..., 2) to GCM bytes (..., 16)."""
    raw = np.ascontiguousarray(x, dtype="<u8").view(np.uint8)
    return _BIT_REVERSE[raw].reshape(*x.shape[:-1], BLOCK_BYTES)


def gcm_mul(a: bytes, b: bytes) -> bytes:
    """Product of two 16-byte GCM-encoded elements, GCM-encoded."""
    return to_gcm(mul(from_gcm(a), from_gcm(b))).tobytes()


def poly_hash(
    key: bytes, data: bytes | memoryview | NDArray[np.uint8], *, chunk: int = MAX_GHASH_CHUNK
) -> bytes:
    """sum_{i=1..n} X_i H^(n + 2 - i) for the n 16-byte blocks X_i of ``data``; GCM bytes.

    H = AES_key(0^128) is GCM's hash key, so for a uniformly random 16-byte
    ``key`` this is a polynomial evaluated at a uniform point: two inputs of n
    blocks collide with probability at most (n + 1) / 2^128. It is GF(2^128)
    linear in the blocks. Computed from the AES-GCM tag of ``data`` as
    associated data: tag = AES_key(J0) + GHASH_H(X_1 .. X_n, L) with the length
    block L, and GHASH_H(..., L) = poly_hash + L H, so both terms are removed.
    ``chunk`` (bytes, a multiple of 16) bounds each GCM call.
    """
    if isinstance(data, np.ndarray):
        view = np.ascontiguousarray(data).view(np.uint8).reshape(-1).data
    else:
        view = memoryview(data)
        view = view.cast("B") if view.nbytes else memoryview(b"")
    n_bytes = view.nbytes
    if n_bytes % BLOCK_BYTES:
        raise ValueError(f"poly_hash needs whole 16-byte blocks, got {n_bytes} bytes")
    if chunk <= 0 or chunk % BLOCK_BYTES:
        raise ValueError(f"chunk must be a positive multiple of 16 bytes, got {chunk}")
    ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    out = ecb.update(bytes(BLOCK_BYTES) + _J0)
    h = from_gcm(out[:BLOCK_BYTES])
    e_j0 = from_gcm(out[BLOCK_BYTES:])
    aead = AESGCM(key)
    acc = np.zeros(2, dtype=np.uint64)
    for start in range(0, max(n_bytes, 1), chunk):
        part = view[start : start + chunk]
        tag = from_gcm(aead.encrypt(_NONCE, b"", part))
        length = from_gcm((8 * part.nbytes).to_bytes(8, "big") + bytes(8))
        value = tag ^ e_j0 ^ mul(length, h)
        # Blocks of earlier chunks sit part.nbytes / 16 powers of H further up.
        acc = value if start == 0 else mul(acc, power(h, part.nbytes // BLOCK_BYTES)) ^ value
    return to_gcm(acc).tobytes()
