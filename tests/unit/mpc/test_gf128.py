"""GF(2^128) arithmetic against a schoolbook reference and OpenSSL's GHASH."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from capc.mpc import gf128

MOD = (1 << 128) | 0x87  # x^128 + x^7 + x^2 + x + 1
M64 = (1 << 64) - 1


def ref_mul(a: int, b: int) -> int:
    """Schoolbook product modulo MOD, on Python integers (bit i = coefficient of x^i)."""
    p = 0
    for i in range(128):
        if (b >> i) & 1:
            p ^= a << i
    for i in range(254, 127, -1):
        if (p >> i) & 1:
            p ^= MOD << (i - 128)
    return p


def words(values: list[int]) -> np.ndarray:
    return np.array([[v & M64, v >> 64] for v in values], dtype=np.uint64)


def ints(blocks: np.ndarray) -> list[int]:
    return [int(lo) | (int(hi) << 64) for lo, hi in blocks.reshape(-1, 2)]


def gcm_int(block: bytes) -> int:
    """SP 800-38D: the leftmost (most significant) bit of byte 0 is the coefficient of x^0."""
    return sum(((block[i // 8] >> (7 - i % 8)) & 1) << i for i in range(128))


def rand_ints(n: int) -> list[int]:
    return [int.from_bytes(os.urandom(16), "little") for _ in range(n)]


def test_mul_matches_the_schoolbook_reference() -> None:
    a = [*rand_ints(200), 0, 1, 1 << 127, (1 << 128) - 1]
    b = [*rand_ints(200), 5, 1, 2, (1 << 128) - 1]
    got = ints(gf128.mul(words(a), words(b)))
    assert got == [ref_mul(x, y) for x, y in zip(a, b, strict=True)]
    assert got[-2] == 0x87  # x^127 * x = x^128 = x^7 + x^2 + x + 1


def test_mul_on_large_arrays_works_in_chunks() -> None:
    """More elements than clmul64 handles in one chunk give the same products."""
    n = 3 * (1 << 14) + 5
    a = np.frombuffer(os.urandom(16 * n), dtype=np.uint64).reshape(n, 2)
    b = np.frombuffer(os.urandom(16 * n), dtype=np.uint64).reshape(n, 2)
    got = gf128.mul(a, b)
    for start in range(0, n, 7001):
        np.testing.assert_array_equal(
            got[start : start + 7001], gf128.mul(a[start : start + 7001], b[start : start + 7001])
        )
    idx = np.random.default_rng(3).integers(0, n, 40)
    assert ints(got[idx]) == [
        ref_mul(x, y) for x, y in zip(ints(a[idx]), ints(b[idx]), strict=True)
    ]


def test_mul_is_a_field_product() -> None:
    a, b, c = (words(rand_ints(16)) for _ in range(3))
    np.testing.assert_array_equal(gf128.mul(a, b), gf128.mul(b, a))
    np.testing.assert_array_equal(gf128.mul(gf128.mul(a, b), c), gf128.mul(a, gf128.mul(b, c)))
    np.testing.assert_array_equal(gf128.mul(a, b ^ c), gf128.mul(a, b) ^ gf128.mul(a, c))
    one = np.zeros_like(a)
    one[:, 0] = 1
    # a^(2^128 - 2) is the inverse of a != 0 (the multiplicative group has order 2^128 - 1).
    np.testing.assert_array_equal(gf128.mul(a, gf128.power(a, 2**128 - 2)), one)
    np.testing.assert_array_equal(gf128.power(a, 0), one)
    with pytest.raises(ValueError, match="non-negative"):
        gf128.power(a, -1)


def test_gcm_encoding_follows_sp800_38d() -> None:
    blocks = [os.urandom(16) for _ in range(20)]
    arr = np.frombuffer(b"".join(blocks), dtype=np.uint8).reshape(20, 16)
    assert ints(gf128.from_gcm(arr)) == [gcm_int(b) for b in blocks]
    assert ints(gf128.from_gcm(blocks[0])) == [gcm_int(blocks[0])]
    np.testing.assert_array_equal(gf128.to_gcm(gf128.from_gcm(arr)), arr)
    assert gcm_int(b"\x80" + bytes(15)) == 1
    with pytest.raises(ValueError, match="16 bytes"):
        gf128.from_gcm(bytes(15))


def test_gcm_mul_agrees_with_openssl_ghash() -> None:
    """One block A as GCM associated data: tag(A) + tag(0) = A H^2, H = AES_k(0)."""
    for _ in range(10):
        key, block = os.urandom(16), os.urandom(16)
        h = Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(bytes(16))
        aead = AESGCM(key)
        diff = bytes(
            x ^ y
            for x, y in zip(
                aead.encrypt(bytes(12), b"", block),
                aead.encrypt(bytes(12), b"", bytes(16)),
                strict=True,
            )
        )
        assert gf128.gcm_mul(gf128.gcm_mul(block, h), h) == diff


def test_poly_hash_is_the_polynomial_at_the_ghash_key() -> None:
    key = os.urandom(16)
    h = gcm_int(Cipher(algorithms.AES(key), modes.ECB()).encryptor().update(bytes(16)))
    for n in (0, 1, 2, 37):
        data = os.urandom(16 * n)
        expect, power = 0, ref_mul(h, h)  # X_n gets H^2, X_(n-1) H^3, ...
        for i in reversed(range(n)):
            expect ^= ref_mul(gcm_int(data[16 * i : 16 * i + 16]), power)
            power = ref_mul(power, h)
        got = gf128.poly_hash(key, data)
        assert gcm_int(got) == expect
        assert gf128.poly_hash(key, data, chunk=16 * 5) == got  # chunks recombine
        assert gf128.poly_hash(key, np.frombuffer(data, dtype=np.uint8).reshape(n, 16)) == got


def test_poly_hash_is_linear_and_checks_its_input() -> None:
    key = os.urandom(16)
    a, b = os.urandom(16 * 9), os.urandom(16 * 9)
    xor = bytes(x ^ y for x, y in zip(a, b, strict=True))
    pa, pb = gf128.poly_hash(key, a), gf128.poly_hash(key, b)
    assert gf128.poly_hash(key, xor) == bytes(x ^ y for x, y in zip(pa, pb, strict=True))
    with pytest.raises(ValueError, match="whole 16-byte blocks"):
        gf128.poly_hash(key, bytes(17))
    with pytest.raises(ValueError, match="multiple of 16"):
        gf128.poly_hash(key, bytes(32), chunk=24)
