"""128-bit blocks and the fixed-key AES primitives built on them.

A block is a pair of uint64 words (low, high); arrays of blocks have shape
(..., 2). Both garbling and OT extension need a tweakable correlation-robust
hash; we use MMO with an orthomorphism (Guo, Katz, Wang, Yu, IEEE S&P 2020):

    H(x, i) = pi(sigma(x) xor i) xor sigma(x),  sigma(lo, hi) = (lo xor hi, lo)

with pi = AES-128 under a fixed, public key. A whole layer of a circuit (every
gate and every query of the batch) goes through one ECB call, so the cost per
hash is that of AES-NI rather than of Python.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import NDArray

Blocks = NDArray[np.uint64]

BLOCK_BYTES = 16


def random_blocks(count: int | tuple[int, ...], key: bytes, nonce: int = 0) -> Blocks:
    """Pseudorandom blocks from AES-128-CTR under ``key`` starting at block ``nonce``.

    Shape ``(*count, 2)``; callers pass a fresh 16-byte key from os.urandom (or a
    seed in the OT extension, where the stream position is the nonce).
    """
    shape = (count,) if isinstance(count, int) else tuple(count)
    n = int(np.prod(shape))
    counter = int(nonce).to_bytes(16, "big")
    enc = Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()
    return (
        np.frombuffer(enc.update(bytes(16 * n)), dtype="<u8").astype(np.uint64).reshape(*shape, 2)
    )


def lsb(blocks: Blocks) -> NDArray[np.uint64]:
    """The point-and-permute bit of each block: bit 0 of the low word; shape (...)."""
    return blocks[..., 0] & np.uint64(1)


def select(bits: NDArray[np.uint64], blocks: Blocks) -> Blocks:
    """``blocks`` where ``bits`` is 1 and zero where it is 0; bits shape (...), blocks (..., 2)."""
    mask = np.uint64(0) - bits.astype(np.uint64)
    return blocks & mask[..., None]


class FixedKeyHash:
    """The tweakable hash H(x, i) above, batched.

    ``key`` (16 bytes) is public to both parties; sessions derive it from both
    parties' hello contributions, so neither chooses it alone. What matters
    for security is that a tweak is never used for more than one gate or OT.
    """

    def __init__(self, key: bytes = bytes(range(16))) -> None:
        if len(key) != 16:
            raise ValueError(f"the fixed AES key is 16 bytes, got {len(key)}")
        self.key = key
        self._enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
        self._out = np.empty(0, dtype=np.uint8)

    def __call__(self, x: Blocks, tweak_lo: NDArray[np.uint64], tweak_hi: int) -> Blocks:
        """Hash blocks ``x`` (..., 2) with tweaks (tweak_lo (...), tweak_hi scalar)."""
        return self.hash_sigma(sigma(x), tweak_lo, tweak_hi)

    def hash_sigma(self, sig: Blocks, tweak_lo: NDArray[np.uint64], tweak_hi: int) -> Blocks:
        """H for inputs already mapped through :func:`sigma` (linear, so callers can
        derive sigma(x xor R) = sigma(x) xor sigma(R) without recomputing). Overwrites ``sig``."""
        if sig.size == 0:  # an empty batch; memoryview cannot cast a zero-length shape
            return sig
        inp = np.empty_like(sig)
        np.bitwise_xor(sig[..., 0], tweak_lo, out=inp[..., 0])
        np.bitwise_xor(sig[..., 1], np.uint64(tweak_hi), out=inp[..., 1])
        nbytes = inp.nbytes
        if self._out.size < nbytes + 15:
            self._out = np.empty(nbytes + 15, dtype=np.uint8)
        self._enc.update_into(inp.data.cast("B"), self._out.data)
        np.bitwise_xor(self._out[:nbytes].view(np.uint64).reshape(sig.shape), sig, out=sig)
        return sig


def sigma(x: Blocks, out: Blocks | None = None) -> Blocks:
    """The orthomorphism sigma(lo, hi) = (lo xor hi, lo), blockwise; same shape."""
    res = np.empty(x.shape, dtype=np.uint64) if out is None else out
    np.bitwise_xor(x[..., 0], x[..., 1], out=res[..., 0])
    res[..., 1] = x[..., 0]
    return res


def transpose_bits(matrix: NDArray[np.uint8], rows: int) -> NDArray[np.uint8]:
    """Transpose a bit matrix.

    ``matrix`` has shape (rows, cols/8): row r holds cols bits packed
    little-endian. Returns (cols, rows/8) with the same packing. ``rows`` and
    cols must be multiples of 8. Works on 8x8 bit tiles held in one uint64, so
    it costs a few vectorised passes rather than one byte per bit.
    """
    if matrix.shape[0] != rows or rows % 8:
        raise ValueError(f"bit matrix must have a multiple of 8 rows, got {matrix.shape}")
    col_bytes = matrix.shape[1]
    groups = rows // 8
    # tile[c, g] holds rows 8g..8g+7 of column byte c, row 8g+i in byte i.
    tiles = np.ascontiguousarray(matrix.reshape(groups, 8, col_bytes).transpose(2, 0, 1)).view(
        np.uint64
    )[..., 0]
    x = tiles
    for shift, mask in (
        (7, 0x00AA00AA00AA00AA),
        (14, 0x0000CCCC0000CCCC),
        (28, 0x00000000F0F0F0F0),
    ):
        t = (x ^ (x >> np.uint64(shift))) & np.uint64(mask)
        x = x ^ t ^ (t << np.uint64(shift))
    # After the tile transpose, byte j of x[c, g] holds column 8c+j for rows 8g..8g+7.
    out = np.ascontiguousarray(x).view(np.uint8).reshape(col_bytes, groups, 8).transpose(0, 2, 1)
    return np.ascontiguousarray(out).reshape(col_bytes * 8, groups)
