"""Exact integer noise in numpy batches: Bernoulli(exp(-gamma)), geometric, discrete Laplace.

The same algorithms as :mod:`capc.privacy.discrete_gaussian` (Canonne, Kamath
and Steinke 2020, Algorithms 1 and 2), run on whole arrays at once: every
element follows its own exact sequence of draws, and the loops are over the
rounds of rejection, never over elements. Nothing is a float, so the output
distribution is exactly the stated one given uniform bits (from
:class:`~capc.privacy.randomness.SecureRandom`, an AES-CTR DRBG), and the
floating-point attacks on textbook samplers (Mironov 2012) have nothing to
read.

Discrete Laplace with integer scale t, P[z] = (1 - q) / (1 + q) * q^|z| with
q = exp(-1/t), is drawn as the difference of two independent geometric
variables G with P[G = g] = (1 - q) q^g (g >= 0):

    P[G1 - G2 = z] = sum_g (1 - q)^2 q^(g + |z|) q^g = (1 - q)^2 q^|z| / (1 - q^2).

Each geometric variable is U + t V with U uniform on {0, .., t - 1} accepted
with probability exp(-U / t), and V the number of successes of
Bernoulli(exp(-1)) before the first failure: P[U + t V = g] is proportional
to exp(-U / t) exp(-V) = q^g (ibid., Algorithm 2).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from capc.privacy.randomness import SecureRandom

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


def randbelow(n: int, size: int, rng: SecureRandom) -> IntArray:
    """(size,) independent uniform integers in [0, n), exactly: masked 64-bit words,
    out-of-range ones redrawn (rejection keeps every value equally likely)."""
    if not 1 <= n <= 2**63:
        raise ValueError(f"randbelow needs 1 <= n <= 2**63, got {n}")
    mask = np.uint64((1 << (n - 1).bit_length()) - 1)
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    while todo.size:
        x = rng.uint64(todo.size) & mask
        ok = x < np.uint64(n)
        out[todo[ok]] = x[ok].astype(np.int64)
        todo = todo[~ok]
    return out


def bernoulli_exp_at_most_one(
    numerator: IntArray, denominator: int, rng: SecureRandom
) -> BoolArray:
    """Per element True with probability exp(-numerator / denominator), exactly, for
    0 <= numerator <= denominator (Algorithm 1: K is odd with probability exp(-gamma),
    where K is the first k with a failed Bernoulli(gamma / k)). Each Bernoulli(gamma / k)
    is Bernoulli(gamma) and Bernoulli(1 / k) at once, so no denominator exceeds
    ``denominator`` (at most 2**63)."""
    num = np.asarray(numerator, dtype=np.int64)
    if denominator < 1 or (num.size and (num.min() < 0 or num.max() > denominator)):
        raise ValueError("need 0 <= numerator <= denominator and denominator >= 1")
    out = np.empty(num.shape, dtype=bool)
    flat = out.reshape(-1)
    live = np.arange(num.size)
    left = num.reshape(-1)
    k = 1
    while live.size:
        go_on = randbelow(denominator, live.size, rng) < left
        go_on &= randbelow(k, live.size, rng) == 0
        flat[live[~go_on]] = k % 2 == 1
        live, left = live[go_on], left[go_on]
        k += 1
    return out


def bernoulli_exp(gamma: Fraction, size: int, rng: SecureRandom) -> BoolArray:
    """(size,) independent draws, True with probability exp(-gamma) exactly (gamma >= 0
    rational): the product of floor(gamma) draws at exp(-1) and one at the remainder."""
    if gamma < 0:
        raise ValueError(f"bernoulli_exp needs gamma >= 0, got {gamma}")
    whole, rest = divmod(gamma, 1)
    out = np.ones(size, dtype=bool)
    for _ in range(int(whole)):
        out &= bernoulli_exp_at_most_one(np.ones(size, dtype=np.int64), 1, rng)
    rest = Fraction(rest)
    ones = np.full(size, rest.numerator, dtype=np.int64)
    return out & bernoulli_exp_at_most_one(ones, rest.denominator, rng)


def geometric(t: int, size: int, rng: SecureRandom) -> IntArray:
    """(size,) independent draws of G >= 0 with P[G = g] proportional to exp(-g / t)."""
    if t < 1:
        raise ValueError(f"the geometric scale t must be an integer >= 1, got {t}")
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        u = randbelow(t, pending.size, rng)
        accepted = bernoulli_exp_at_most_one(u, t, rng)
        done, u = pending[accepted], u[accepted]
        v = np.zeros(done.size, dtype=np.int64)
        live = np.arange(done.size)
        while live.size:
            success = bernoulli_exp_at_most_one(np.ones(live.size, dtype=np.int64), 1, rng)
            live = live[success]
            v[live] += 1
        out[done] = u + t * v
        pending = pending[~accepted]
    return out


def discrete_laplace(t: int, shape: int | tuple[int, ...], rng: SecureRandom) -> IntArray:
    """Independent integers with P[z] proportional to exp(-|z| / t), t an integer >= 1,
    in an array of ``shape``: the difference of two geometric draws (module docstring)."""
    size = int(np.prod(shape))
    return (geometric(t, size, rng) - geometric(t, size, rng)).reshape(shape)
