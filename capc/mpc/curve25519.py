"""Curve25519 points with unknown discrete logarithm (hash to curve).

The base OT needs a public key for which the receiver provably knows no
secret key. ``oblivious_point`` hashes fresh random bytes to the curve the
way RFC 9380's random-oracle encoding does: two Elligator 2 maps, a point
addition, and cofactor clearing (multiplication by 8). The result is a
statistically near-uniform point of the prime-order subgroup, like an X25519
public key, but nobody knows its logarithm.

Python integers are fine here: this runs 128 times per session, not per query.
"""

from __future__ import annotations

import hashlib

P = 2**255 - 19
A = 486662
#: A square root of -1 modulo P.
SQRT_M1 = pow(2, (P - 1) // 4, P)


def _inv(x: int) -> int:
    return pow(x, P - 2, P)


def _is_square(x: int) -> bool:
    return x % P == 0 or pow(x, (P - 1) // 2, P) == 1


def _sqrt(x: int) -> int:
    """A square root of a square modulo P (P = 5 mod 8)."""
    r = pow(x, (P + 3) // 8, P)
    if (r * r - x) % P:
        r = r * SQRT_M1 % P
    if (r * r - x) % P:
        raise ValueError("not a square")
    return r


def _rhs(u: int) -> int:
    return (u * u * u + A * u * u + u) % P


def elligator2(r: int) -> tuple[int, int]:
    """Elligator 2 map of field element ``r`` to an affine point (u, v) of Curve25519."""
    u = -A * _inv(1 + 2 * r * r) % P
    if not _is_square(_rhs(u)):
        u = (-A - u) % P
    return u, _sqrt(_rhs(u))


def _add(p1: tuple[int, int], p2: tuple[int, int]) -> tuple[int, int]:
    (u1, v1), (u2, v2) = p1, p2
    if u1 == u2:
        raise ValueError("degenerate addition")
    lam = (v2 - v1) * _inv(u2 - u1) % P
    u3 = (lam * lam - A - u1 - u2) % P
    return u3, (lam * (u1 - u3) - v1) % P


def _double_u(u: int) -> int:
    # x-only doubling on B v^2 = u^3 + A u^2 + u: (u^2 - 1)^2 / (4 u (u^2 + A u + 1))
    den = 4 * u * (u * u + A * u + 1) % P
    if den == 0:
        raise ValueError("doubling a point of order 2")
    return (u * u - 1) ** 2 * _inv(den) % P


def oblivious_point(seed: bytes) -> bytes:
    """A 32-byte X25519 public key with no known secret key, derived from 32+ random bytes."""
    if len(seed) < 32:
        raise ValueError("oblivious_point needs at least 32 random bytes")
    wide = hashlib.sha512(b"capc/mpc/hash-to-curve/" + seed).digest()
    r0 = int.from_bytes(wide[:32], "little") % P
    r1 = int.from_bytes(wide[32:], "little") % P
    u, _ = _add(elligator2(r0), elligator2(r1))
    for _ in range(3):
        u = _double_u(u)
    return u.to_bytes(32, "little")
