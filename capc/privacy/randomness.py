"""Cryptographically secure randomness for privacy noise.

Noise that protects patients must not be predictable from earlier outputs, so
it never comes from a statistical generator (PCG, Mersenne Twister). The
source here is AES-256 in counter mode keyed from the operating system's
CSPRNG: a standard DRBG construction, fast enough to fill numpy batches.

One source may be shared by threads (the guardian's serves every student
session): each draw takes the keystream under a lock, so concurrent draws get
disjoint stretches of it, never the same bytes, and never the cipher's
"Already borrowed" error (the cipher object is not thread-safe).
"""

from __future__ import annotations

import hashlib
import math
import os
import threading

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import NDArray

_BUFFER = 4096


class SecureRandom:
    """An AES-256-CTR keystream used as a source of uniform random bits.

    ``SecureRandom()`` keys itself from ``os.urandom`` and is what services use.
    :meth:`from_seed` gives a reproducible stream for tests and for replaying a
    mechanism with known noise; never use it to protect real data.

    Safe under concurrent use: every draw takes its bytes under one lock, so each
    call's bytes are a stretch of the keystream no other call gets. (A seeded stream
    shared by threads is reproducible only when the draws come in the same order.)
    """

    def __init__(self, key: bytes | None = None) -> None:
        key = os.urandom(32) if key is None else key
        if len(key) != 32:
            raise ValueError(f"SecureRandom needs a 32-byte key, got {len(key)} bytes")
        self._enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        self._buf = b""
        self._pos = 0
        self._lock = threading.Lock()

    @classmethod
    def from_seed(cls, seed: bytes | str | int) -> SecureRandom:
        """A deterministic stream derived from ``seed`` (tests and replays only)."""
        raw = seed if isinstance(seed, bytes) else str(seed).encode()
        return cls(hashlib.sha256(b"capc/SecureRandom/" + raw).digest())

    def random_bytes(self, n: int) -> bytes:
        """``n`` fresh uniform bytes."""
        if n < 0:
            raise ValueError(f"byte count must be >= 0, got {n}")
        with self._lock:
            return self._enc.update(bytes(n))

    def _take(self, n: int) -> bytes:
        # Python-level draws (the exact samplers) take a few bytes at a time;
        # buffering keeps the per-call cost of the cipher off that path. The buffer
        # and its position change together, under the same lock as the cipher.
        with self._lock:
            if self._pos + n > len(self._buf):
                fresh = self._enc.update(bytes(max(_BUFFER, n)))
                self._buf = self._buf[self._pos :] + fresh
                self._pos = 0
            out = self._buf[self._pos : self._pos + n]
            self._pos += n
            return out

    def uint64(self, shape: int | tuple[int, ...]) -> NDArray[np.uint64]:
        """Uniform 64-bit unsigned integers of the given shape."""
        size = int(np.prod(shape))
        return (
            np.frombuffer(self.random_bytes(8 * size), dtype="<u8").astype(np.uint64).reshape(shape)
        )

    def uniform(self, shape: int | tuple[int, ...]) -> NDArray[np.float64]:
        """Uniform floats in the open interval (0, 1), 53 random bits each."""
        u = self.uint64(shape) >> np.uint64(11)
        return (u.astype(np.float64) + 0.5) * 2.0**-53

    def normal(self, shape: int | tuple[int, ...], scale: float = 1.0) -> NDArray[np.float64]:
        """Gaussian noise N(0, scale**2) by the Box-Muller transform, in floating point (as
        with :meth:`laplace`, never for privacy noise: use
        :mod:`capc.privacy.rounded_gaussian`, the exact Gaussian on a grid).

        The smallest uniform is 2**-54, so samples are confined to about 8.7
        standard deviations: a tail mass below 1e-17, far under any delta used.
        """
        u1 = self.uniform(shape)
        u2 = self.uniform(shape)
        return scale * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)

    def laplace(self, shape: int | tuple[int, ...], scale: float) -> NDArray[np.float64]:
        """Laplace noise with density exp(-|x|/scale) / (2 scale), in floating point.

        Never add it to a number that is released: the outputs form a sparse set
        (Mironov 2012), so ``released - noise`` can give the secret away (the old float
        ALIBI did; :func:`capc.audit.canaries.audit_support` refutes such a release). For
        privacy noise use :mod:`capc.privacy.exact_noise`; this is for tests (as
        the float sampler of the releases the audit must refute)."""
        magnitude = -np.log(self.uniform(shape)) * scale
        sign = np.where(self.uint64(shape) & np.uint64(1), 1.0, -1.0)
        return sign * magnitude

    def randbelow(self, n: int) -> int:
        """A uniform integer in [0, n), exactly (rejection sampling)."""
        if n <= 0:
            raise ValueError(f"randbelow needs n >= 1, got {n}")
        if n == 1:
            return 0
        bits = (n - 1).bit_length()
        nbytes = (bits + 7) // 8
        mask = (1 << bits) - 1
        while True:
            x = int.from_bytes(self._take(nbytes), "little") & mask
            if x < n:
                return x

    def bernoulli(self, numerator: int, denominator: int) -> bool:
        """True with probability numerator / denominator, exactly."""
        if denominator <= 0 or not 0 <= numerator <= denominator:
            raise ValueError(
                f"bernoulli needs 0 <= {numerator} <= {denominator} and a positive denominator"
            )
        return self.randbelow(denominator) < numerator
