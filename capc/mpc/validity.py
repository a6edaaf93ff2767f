"""Vote validity proofs: a hospital proves its shared vote is a valid vote, revealing nothing.

A fully linear proof (Boneh, Boyle, Corrigan-Gibbs, Gilboa, Ishai 2019) over
F_p, p = 2^61 - 1, checked jointly by the guardian and the student on their
additive shares, vectorised over the queries of a round.

**What is proven.** Per query a party holds counts c (``width`` of them):
how many of its m teachers voted for each class (single label) or each label
(multi-label), zero where it sits the query out. It shares their bits
x in {0,1}^(width x nbits), c_j = sum_b 2^b x_{j,b}, and proves

- every x is a bit (so every c_j is an integer in [0, 2^nbits));
- single label: sum_j c_j = m x participation (so c_j <= m, and each teacher
  cast exactly one vote; all zero where it sits out);
- multi-label (``complement``): it also shares the bits of d_j = m x
  participation - c_j and proves c_j + d_j = m x participation (so c_j <= m).
- tau voting (``grid_bits`` 8, ``tau``): the counts are sums of the
  teachers' clipped votes on the 2^-8 grid, so the bounds above use
  M = m x 2^8 for m; it also shares y_j = c_j^2 (field elements) and the bits
  of the slack D, and proves sum_j y_j + D = floor((M tau)^2) x participation:
  the counts' L2 norm is at most m x tau votes.

Its votes are then w' c_j, w' its weight on the shares' fixed-point grid:
a linear map, which each verifier applies to its own shares. That is the
link to the circuit: the shares the proof is about *are* the shares the
circuit's input is derived from (:func:`ring_shares`).

**The proof.** For one query with n = len(x): the wire polynomial f of
degree n with f(0) = rho (random, the blinding) and f(i) = x_i, i = 1..n;
the proof polynomial q = f^2 - f, of degree 2n, which vanishes at 1..n for
a valid x. (Under tau the last ``width`` gates square the counts instead:
there f(i) = c_j, a linear function of the bits, and q(i) = y_j - c_j, which
the verifiers compute from their shares; both are linear, so nothing else
changes.) The proof is rho, q(0) and q(n+1..2n) (n + 2 elements; q(1..n)
are 0 by definition). The verifiers hold shares of x and of the proof; at a
random point t (drawn by the guardian after every share arrived, so no
prover can adapt to it) each computes its share of f(t) and of q(t) by
Lagrange interpolation, a linear map. The student sends its share of f(t)
per query and one random linear combination of its shares of q(t) and of
the linear constraints; the guardian adds its own and checks
sum_q r_q (q_q(t) - f_q(t)^2 + f_q(t)) + sum r'_(q,j) lin_(q,j) = 0.

Soundness: an invalid x has f^2 - f != q as polynomials of degree <= 2n, so
they agree at t with probability <= 2n / p; the random combination then
vanishes with probability <= 1 / p. Zero knowledge: f(t) is uniform
(rho is), q(t) is f(t)^2 - f(t) and the combination is 0 for a valid vote.
A deviating student can make an honest party's check fail (the party is
then left out, as if it had dropped) or pass a colluding party's invalid
vote (which is the student offsetting its own input: the circuit's checks
and offset-robust mechanisms cover it; see docs/security.md).

**Shares.** The student's shares come from the party's sealed 128-bit seed
(AES-CTR, 61-bit words, the value p folded to 0: statistical distance at
most 2^-61 per element from uniform); the guardian's are the rest, sent in
the clear. Their sums reconstruct each count exactly in F_p. Converting to
the circuit's ring: with G the guardian's and S the student's sum of the
parties' vote shares (both in [0, p)), G + S = h + p unless S <= h, which
has probability (h + 1) / p when S is uniform (one honest party suffices);
the guardian inputs G and the student S - p, modulo 2^64. In the rare
other case the count comes out as h + 1 (p = -1 mod 2^l): a unit offset
that depends on h, which the circuit's exact total check would turn into a
noiseless bit. No local conversion avoids the event (S is the student's
own view), so it is kept rare and bounded: each party's counts are
converted on their own, *before* weighting (h at most its teachers, not
teachers x 2^frac_bits), and weighted and summed in the ring, which is
exact. Per party, not per sum: the student picks which votes count after
seeing every party's S, so a sum's S would be its choice, a party's is its
seed's. :func:`conversion_failure` bounds the probability per round and
the guardian refuses a round above ``MAX_CONVERSION_FAILURE`` (2^-40, the
project's statistical security parameter).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import ArrayLike, NDArray

U64 = NDArray[np.uint64]

#: The field's modulus, the Mersenne prime 2^61 - 1.
P = (1 << 61) - 1
_P = np.uint64(P)
_M32 = np.uint64(0xFFFFFFFF)
_M29 = np.uint64((1 << 29) - 1)
#: Largest proof relation (elements per query) a round accepts: the prover's cost is n^2.
MAX_ELEMENTS = 512
#: Largest probability a round's F_p -> Z_2^64 conversion may go wrong (see the module
#: docstring): the statistical security parameter, 40 bits, that the rest of the protocol
#: meets too.
MAX_CONVERSION_FAILURE = 2.0**-40


class ValidityError(ValueError):
    """A vote, proof or verifier message is malformed; the message says which."""


# -- the field, vectorised ---------------------------------------------------------
def _fold(x: U64) -> U64:
    """x < 2^64 -> x mod p (two folds of 2^61 = 1, then one subtraction)."""
    x = (x & _P) + (x >> np.uint64(61))
    x = (x & _P) + (x >> np.uint64(61))
    return x - np.where(x >= _P, _P, np.uint64(0))


def field_add(a: ArrayLike, b: ArrayLike) -> U64:
    """(a + b) mod p for reduced operands; broadcasts."""
    s = np.asarray(a, dtype=np.uint64) + np.asarray(b, dtype=np.uint64)
    return s - np.where(s >= _P, _P, np.uint64(0))


def field_sub(a: ArrayLike, b: ArrayLike) -> U64:
    """(a - b) mod p for reduced operands; broadcasts."""
    return field_add(a, _P - np.asarray(b, dtype=np.uint64))


def field_mul(a: ArrayLike, b: ArrayLike) -> U64:
    """(a * b) mod p for reduced operands, with 32-bit limbs in uint64; broadcasts."""
    x = np.asarray(a, dtype=np.uint64)
    y = np.asarray(b, dtype=np.uint64)
    xh, xl = x >> np.uint64(32), x & _M32
    yh, yl = y >> np.uint64(32), y & _M32
    hh = xh * yh  # < 2^58; times 2^64 = 8 mod p
    mid = xh * yl + xl * yh  # < 2^62; times 2^32
    ll = xl * yl  # < 2^64
    r = (
        (hh << np.uint64(3))
        + (mid >> np.uint64(29))
        + ((mid & _M29) << np.uint64(32))
        + (ll & _P)
        + (ll >> np.uint64(61))
    )
    return _fold(r)


def dot(coeffs: ArrayLike, values: ArrayLike) -> U64:
    """sum_i coeffs[i] * values[..., i] mod p: (n,) x (..., n) -> (...)."""
    c = np.asarray(coeffs, dtype=np.uint64)
    return dot_rows(c.reshape(1, -1), values)[..., 0]


def dot_rows(coeffs: ArrayLike, values: ArrayLike) -> U64:
    """sum_i coeffs[k, i] * values[..., i] mod p for every row k: (k, n) x (..., n) ->
    (..., k).

    One float64 matrix product, exact: both operands are cut into three limbs of at
    most 21 bits, so each limb product is below 2^42 and each output column (one per row
    and limb weight 2^(21j), five weights) sums at most 3n of them, below 2^53 for
    n < 682; the columns are folded back mod p (2^61 = 1) in integers.
    """
    c = np.asarray(coeffs, dtype=np.uint64)
    v = np.asarray(values, dtype=np.uint64)
    rows, n = c.shape
    if v.shape[-1] != n:
        raise ValidityError(f"dot of {n} coefficients with values of shape {v.shape}")
    if n > _EXACT_TERMS:
        raise ValidityError(f"at most {_EXACT_TERMS} terms are summed exactly, got {n}")
    lead = v.shape[:-1]
    vl = _limbs(v.reshape(-1, n)).reshape(-1, 3 * n)  # (N, 3n): column 3i + a
    cl = _limbs(c)  # (k, n, 3)
    weights = np.zeros((n, 3, rows, 5), dtype=np.float64)
    for a in range(3):
        for b in range(3):
            weights[:, a, :, a + b] = cl[:, :, b].T
    # (N, k, 5); exact: every entry is below 2^53.
    cols = (vl @ weights.reshape(3 * n, 5 * rows)).astype(np.uint64).reshape(-1, rows, 5)
    total = cols[..., 0]
    for k in range(1, 5):
        total += _times_power_of_two(cols[..., k], (21 * k) % 61)
    return _fold(total).reshape(*lead, rows)


#: Most terms :func:`dot` sums in one exact float64 product.
_EXACT_TERMS = 600
_M21 = np.uint64((1 << 21) - 1)


def _limbs(x: U64) -> NDArray[np.float64]:
    """x < 2^61 -> (..., 3) float64 limbs of 21, 21 and 19 bits, lowest first."""
    return np.stack([x & _M21, (x >> np.uint64(21)) & _M21, x >> np.uint64(42)], axis=-1).astype(
        np.float64
    )


def _times_power_of_two(x: U64, s: int) -> U64:
    """x * 2^s mod p, not fully reduced (below 2^61 + 2^53), for x < 2^53 and s < 61."""
    if s == 0:
        return x
    low = (x & np.uint64((1 << (61 - s)) - 1)) << np.uint64(s)
    return low + (x >> np.uint64(61 - s))


def sum_rows(values: ArrayLike) -> U64:
    """sum mod p over the first axis of reduced values: (P, ...) -> (...)."""
    v = np.asarray(values, dtype=np.uint64)
    acc = np.zeros(v.shape[1:], dtype=np.uint64)
    for start in range(0, v.shape[0], 7):  # seven reduced values and a reduced sum fit 64 bits
        acc = _fold(acc + v[start : start + 7].sum(axis=0, dtype=np.uint64))
    return acc


def expand(seed: bytes, count: int, label: bytes) -> U64:
    """``count`` field elements from a 128-bit ``seed`` and a 16-byte-or-less ``label``
    (AES-128-CTR; 61-bit words, p folded to 0)."""
    nonce = label.ljust(16, b"\0")[:16]
    enc = Cipher(algorithms.AES(seed), modes.CTR(nonce)).encryptor()
    raw = np.frombuffer(enc.update(bytes(8 * count)), dtype="<u8").astype(np.uint64)
    x = raw & _P
    return np.where(x == _P, np.uint64(0), x)


def _inv(a: int) -> int:
    return pow(a % P, P - 2, P)


def lagrange_at(t: int, points: int) -> U64:
    """Lagrange coefficients at ``t`` over the nodes 0..points-1: (points,) uint64.

    For consecutive nodes, L_i(t) = prod_j (t - j) / ((t - i) i! (points-1-i)! (-1)^(points-1-i)).
    ``t`` must not be a node.
    """
    if 0 <= t < points:
        raise ValidityError(f"the challenge point {t} is a node")
    n = points - 1
    fact = [1] * (points)
    for i in range(1, points):
        fact[i] = fact[i - 1] * i % P
    whole = 1
    for j in range(points):
        whole = whole * (t - j) % P
    out = np.empty(points, dtype=np.uint64)
    for i in range(points):
        denom = (t - i) * fact[i] * fact[n - i] % P
        sign = -1 if (n - i) % 2 else 1
        out[i] = sign * whole * _inv(denom) % P
    return out


@functools.lru_cache(maxsize=16)
def _extension(n: int) -> U64:
    """(n, n + 1): row k gives f(n + 1 + k) from f(0..n) (Lagrange over nodes 0..n)."""
    return np.stack([lagrange_at(n + 1 + k, n + 1) for k in range(n)])


# -- the relation ---------------------------------------------------------------------
@dataclass(frozen=True)
class VoteRelation:
    """What a valid vote of one party is, per query.

    ``width`` counts (classes, or labels), each written with ``nbits`` bits; the party
    has ``teachers`` teachers. ``complement``: multi-label (counts bounded by the
    teachers, no sum); otherwise one vote per teacher (the counts total the teachers).

    ``grid_bits``: the counts are fixed-point sums of the teachers' votes with that many
    fractional bits, each teacher's vote per column in [0, 2^grid_bits]
    (:attr:`max_count` = teachers x 2^grid_bits bounds a count). ``tau``: each teacher's
    vote (on the grid, in units of 2^grid_bits) also has L2 norm at most ``tau`` (tau
    voting), so the party proves its counts' norm is at most teachers x tau: with the
    per-column bound, its counts lie in the Minkowski sum of its teachers' valid votes'
    convex hull, the same set an honest party's counts lie in. The squared norm is a
    quadratic statement: the party also shares y_j = c_j^2 (field elements) and the
    bits of the slack D = bound - sum_j y_j; the proof has one squaring gate per count
    besides its bit gates (module docstring).
    """

    width: int
    teachers: int
    complement: bool = False
    grid_bits: int = 0
    tau: float | None = None

    def __post_init__(self) -> None:
        if self.width < 1 or self.teachers < 1:
            raise ValidityError("a vote relation needs width >= 1 and teachers >= 1")
        if not 0 <= self.grid_bits <= 16:
            raise ValidityError(f"a vote grid has 0 to 16 fractional bits, got {self.grid_bits}")
        if self.tau is not None:
            if not self.complement:
                raise ValidityError("a norm bound (tau) is proven for per-label counts only")
            if not (math.isfinite(self.tau) and self.tau > 0):
                raise ValidityError(f"tau must be finite and positive, got {self.tau}")
        # Every square and their sum with the slack must stay far below p: no wrap in F_p.
        if self.width * (self.max_count**2 + 1) + 2 * self.norm_bound >= P // 4:
            raise ValidityError("counts this large cannot be proven in F_p: fewer teachers")
        if self.elements > MAX_ELEMENTS:
            raise ValidityError(
                f"a proof over {self.elements} elements per query exceeds {MAX_ELEMENTS}: "
                "too many classes or teachers for vote validity proofs"
            )

    @property
    def max_count(self) -> int:
        """The largest count: every teacher's vote at its largest, 2^grid_bits."""
        return self.teachers << self.grid_bits

    @property
    def nbits(self) -> int:
        return max(1, self.max_count.bit_length())

    @property
    def norm_bound(self) -> int:
        """The largest sum of squared counts, floor((max_count x tau)^2) (0 without tau):
        exact, from tau's binary value."""
        if self.tau is None:
            return 0
        return math.floor((self.max_count * Fraction(self.tau)) ** 2)

    @property
    def slack_bits(self) -> int:
        """Bits of the norm's slack (0 without tau)."""
        return self.norm_bound.bit_length() if self.tau is not None else 0

    @property
    def squares(self) -> int:
        """Squaring gates per query: one per count under a norm bound, else none."""
        return self.width if self.tau is not None else 0

    @property
    def bits(self) -> int:
        """Shared bits per query: the counts', their complements', the slack's."""
        return self.width * self.nbits * (2 if self.complement else 1) + self.slack_bits

    @property
    def elements(self) -> int:
        """n: elements shared per query (the bits, then the squares) and gates proven."""
        return self.bits + self.squares

    @property
    def proof_elements(self) -> int:
        """Proof length per query: rho, q(0), q(n+1..2n)."""
        return self.elements + 2

    @property
    def constraints(self) -> int:
        """Linear constraints per query."""
        if not self.complement:
            return 1
        return self.width + (1 if self.tau is not None else 0)

    def encode(self, counts: ArrayLike, participation: ArrayLike | None = None) -> U64:
        """Counts (B, width) integers in [0, max_count] -> shared elements (B, elements):
        bits in {0, 1}, then under a norm bound the squared counts.

        Raises ValidityError if the counts are not a valid vote (what an honest party
        never produces)."""
        c = np.asarray(counts)
        if c.ndim != 2 or c.shape[1] != self.width or not np.issubdtype(c.dtype, np.integer):
            raise ValidityError(f"counts must be integers of shape (B, {self.width})")
        c = c.astype(np.int64)
        part = np.ones(c.shape[0], dtype=np.int64)
        if participation is not None:
            part = np.asarray(participation, dtype=np.int64)
        cap = self.max_count * part
        if (c < 0).any() or (c > cap[:, None]).any():
            raise ValidityError(f"counts must lie in [0, {self.max_count}] (0 where sitting out)")
        if not self.complement and (c.sum(axis=1) != cap).any():
            raise ValidityError(f"each query's counts must total the {self.teachers} teachers")
        cols = [c] if not self.complement else [c, cap[:, None] - c]
        shifts = np.arange(self.nbits, dtype=np.int64)
        bits = [((v[:, :, None] >> shifts) & 1).reshape(len(c), -1) for v in cols]
        if self.tau is not None:
            squares = c * c
            slack = self.norm_bound * part - squares.sum(axis=1)
            if (slack < 0).any():
                raise ValidityError(
                    f"the counts' L2 norm must be at most {self.teachers} x tau = "
                    f"{self.teachers * self.tau:g} votes"
                )
            sshift = np.arange(self.slack_bits, dtype=np.int64)
            bits.append((slack[:, None] >> sshift) & 1)
            bits.append(squares)
        return np.concatenate(bits, axis=1).astype(np.uint64)

    def _number(self, bit_shares: U64, offset: int, nbits: int, count: int) -> U64:
        """Shares of ``count`` numbers written with ``nbits`` bits from ``offset`` on:
        (..., elements) -> (..., count), a linear map."""
        x = bit_shares[..., offset : offset + count * nbits]
        c = x.reshape(*x.shape[:-1], count, nbits)
        # Horner's rule with doublings: two adds per bit, no general field product.
        acc = c[..., nbits - 1].copy()
        for i in range(nbits - 2, -1, -1):
            acc = field_add(field_add(acc, acc), c[..., i])
        return acc

    def counts(self, bit_shares: ArrayLike) -> U64:
        """Shares of the counts from shares of the bits: (B, elements) -> (B, width), in F_p."""
        return self._number(np.asarray(bit_shares, dtype=np.uint64), 0, self.nbits, self.width)

    def wires(self, shares: ArrayLike) -> U64:
        """Shares of the gates' inputs f(1..n) (B, elements): each bit, then under a norm
        bound each count (the squaring gates' input)."""
        x = np.asarray(shares, dtype=np.uint64)
        if not self.squares:
            return x
        return np.concatenate([x[..., : self.bits], self.counts(x)], axis=-1)

    def square_offsets(self, shares: ArrayLike) -> U64:
        """Shares of q(i) = y_j - c_j at the squaring gates (B, squares): a square gate
        outputs y_j, q = f^2 - f; the bit gates' q(i) are 0 (x^2 - x)."""
        x = np.asarray(shares, dtype=np.uint64)
        return field_sub(x[..., self.bits :], self.counts(x))

    def linear(self, bit_shares: ArrayLike, constant: ArrayLike | None) -> U64:
        """Shares of the linear constraints (B, constraints): zero for a valid vote once
        the guardian subtracts its constants, from ``constant`` (B,) = teachers x
        participation (public to the guardian)."""
        x = np.asarray(bit_shares, dtype=np.uint64)
        c = self.counts(x)
        if self.complement:
            d = self._number(x, self.width * self.nbits, self.nbits, self.width)
            lin = field_add(c, d)
            if self.tau is not None:
                off = 2 * self.width * self.nbits
                slack = self._number(x, off, self.slack_bits, 1)
                norm = slack[..., 0]
                for j in range(self.width):
                    norm = field_add(norm, x[..., self.bits + j])
                lin = np.concatenate([lin, norm[..., None]], axis=-1)
        else:
            lin = np.zeros(len(x), dtype=np.uint64)
            for j in range(self.width):
                lin = field_add(lin, c[:, j])
            lin = lin[:, None]
        if constant is not None:
            part = (np.asarray(constant, dtype=np.uint64).reshape(-1) != 0).astype(np.uint64)
            bounds = [self.max_count] * (self.width if self.complement else 1)
            if self.tau is not None:
                bounds.append(self.norm_bound)
            want = field_mul(part[:, None], np.array(bounds, dtype=np.uint64)[None, :])
            lin = field_sub(lin, want)
        return lin


def max_width(
    teachers: int = 1,
    *,
    complement: bool = False,
    grid_bits: int = 0,
    tau: float | None = None,
) -> int:
    """The most counts per query (``width``) a party with ``teachers`` teachers can prove
    a vote over, the other arguments as :class:`VoteRelation` takes them: the largest
    width whose relation constructs (fits ``MAX_ELEMENTS`` and F_p), 0 where none does.

    Decided by constructing the relations, so every limit derived from it is the
    relation's own (no second copy of its size arithmetic)."""

    def fits(width: int) -> bool:
        try:
            VoteRelation(width, teachers, complement, grid_bits, tau)
        except ValidityError:
            return False
        return True

    # A relation's elements and its F_p bound both grow with its width, so the widths that
    # fit are 1..w; every count has at least one element, so w <= MAX_ELEMENTS.
    lo, hi = 0, MAX_ELEMENTS
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def prove(relation: VoteRelation, bits: ArrayLike) -> U64:
    """The proofs (B, proof_elements) for shared elements (B, elements) (:meth:`VoteRelation.encode`),
    each query its own blinding."""
    x = np.asarray(bits, dtype=np.uint64)
    n = relation.elements
    if x.ndim != 2 or x.shape[1] != n:
        raise ValidityError(f"bits must have shape (B, {n})")
    b = len(x)
    rho = expand(os.urandom(16), b, b"capc-blinding")
    wires = np.concatenate([rho[:, None], relation.wires(x)], axis=1)  # f(0..n)
    ext = _extension(n)  # (n, n+1)
    f_hi = dot_rows(ext, wires)  # f(n+1..2n), (B, n)
    q0 = field_sub(field_mul(rho, rho), rho)
    q_hi = field_sub(field_mul(f_hi, f_hi), f_hi)
    return np.concatenate([rho[:, None], q0[:, None], q_hi], axis=1)


# -- the parties' shares ---------------------------------------------------------------
def student_shares(seed: bytes, relation: VoteRelation, batch: int) -> tuple[U64, U64]:
    """The student's shares (bits (B, n), proof (B, n + 2)) expanded from a party's seed."""
    n, m = relation.elements, relation.proof_elements
    flat = expand(seed, batch * (n + m), b"capc-validity")
    both = flat.reshape(batch, n + m)
    return both[:, :n], both[:, n:]


def guardian_shares(relation: VoteRelation, bits: ArrayLike, seed: bytes) -> tuple[U64, U64]:
    """A party's guardian shares (bits, proof) for ``bits`` (B, n), the student's from ``seed``."""
    x = np.asarray(bits, dtype=np.uint64)
    proof = prove(relation, x)
    xs, ps = student_shares(seed, relation, len(x))
    return field_sub(x, xs), field_sub(proof, ps)


# -- verification --------------------------------------------------------------------
@dataclass(frozen=True)
class Challenge:
    """The round's joint randomness, drawn by the guardian after every share arrived.

    ``point``: where the polynomials are opened (not a node); ``seed``: 16 bytes that
    expand to the random linear combination's coefficients."""

    point: int
    seed: bytes

    @staticmethod
    def draw(random_bytes: bytes) -> Challenge:
        """From 24 secure random bytes: 8 for the point, 16 for the coefficients."""
        if len(random_bytes) != 24:
            raise ValidityError("a challenge is drawn from 24 random bytes")
        # Nodes are small integers: a point below 2^20 is refused by lifting it above.
        t = int.from_bytes(random_bytes[:8], "little") % P
        return Challenge(max(t, 1 << 20), random_bytes[8:])

    def to_bytes(self) -> bytes:
        return self.point.to_bytes(8, "little") + self.seed

    @staticmethod
    def from_bytes(data: bytes) -> Challenge:
        if len(data) != 24:
            raise ValidityError("a challenge is 24 bytes: the point and a 16-byte seed")
        t = int.from_bytes(data[:8], "little")
        if not (1 << 20) <= t < P:
            raise ValidityError("the challenge point is out of range")
        return Challenge(t, data[8:])

    def coefficients(
        self, relation: VoteRelation, batch: int, parties: list[str]
    ) -> tuple[U64, U64]:
        """(r (P, B), r' (P, B x constraints)): each party's coefficients, from the seed and
        its name, so no party's check can be combined into another's."""
        rows = []
        for party in parties:  # one expansion per party, vectorised within it
            label = hashlib.sha256(party.encode()).digest()[:16]
            seed = bytes(a ^ b for a, b in zip(self.seed, label, strict=True))
            rows.append(expand(seed, batch * (1 + relation.constraints), b"capc-coeffs"))
        flat = np.stack(rows) if rows else np.zeros((0, 0), dtype=np.uint64)
        return flat[:, :batch], flat[:, batch:]


@dataclass(frozen=True)
class VerifierShare:
    """One verifier's messages about parties: f(t) per party and query (P, B) and one
    random combination per party (P,)."""

    wire: U64
    combined: U64


@functools.lru_cache(maxsize=64)
def _lagrange(t: int, points: int) -> U64:
    return lagrange_at(t, points)


def verifier_share(
    relation: VoteRelation,
    challenge: Challenge,
    parties: list[str],
    bits: ArrayLike,
    proof: ArrayLike,
    constant: ArrayLike | None = None,
) -> VerifierShare:
    """A verifier's shares of the checks of ``parties`` (P names) from its shares of their
    ``bits`` (P, B, n) and ``proof`` (P, B, n + 2), all parties at once. ``constant``
    (P, B): teachers x participation; the guardian passes it, the student None."""
    x = np.asarray(bits, dtype=np.uint64)
    pr = np.asarray(proof, dtype=np.uint64)
    n = relation.elements
    if x.ndim != 3 or x.shape[0] != len(parties) or x.shape[2] != n:
        raise ValidityError(f"bit shares must have shape ({len(parties)}, B, {n})")
    if pr.shape != (*x.shape[:2], n + 2):
        raise ValidityError(f"proof shares must have shape ({len(parties)}, B, {n + 2})")
    npart, b = x.shape[:2]
    t = challenge.point
    flat_x = x.reshape(npart * b, n)
    flat_p = pr.reshape(npart * b, n + 2)
    wire = dot(_lagrange(t, n + 1), np.concatenate([flat_p[:, :1], relation.wires(flat_x)], axis=1))
    lam = _lagrange(t, 2 * n + 1)
    q_t = field_add(field_mul(flat_p[:, 1], lam[0]), dot(lam[n + 1 :], flat_p[:, 2:]))
    if relation.squares:  # q(i) at the squaring gates is y_j - c_j, not 0
        first = relation.bits + 1
        q_t = field_add(
            q_t, dot(lam[first : first + relation.squares], relation.square_offsets(flat_x))
        )
    const = None if constant is None else np.asarray(constant, dtype=np.uint64).reshape(-1)
    lin = relation.linear(flat_x, const).reshape(npart, b * relation.constraints)
    r, r2 = challenge.coefficients(relation, b, parties)
    terms = field_mul(r, q_t.reshape(npart, b))
    combined = field_add(_row_sums(terms), _row_sums(field_mul(r2, lin)))
    return VerifierShare(wire.reshape(npart, b), combined)


def _row_sums(a: U64) -> U64:
    """sum mod p along the last axis: (P, N) -> (P,), reduced pairwise."""
    x = a
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = np.concatenate([x, np.zeros((*x.shape[:-1], 1), dtype=np.uint64)], axis=-1)
        x = field_add(x[..., 0::2], x[..., 1::2])
    return x[..., 0] if x.shape[-1] else np.zeros(x.shape[:-1], dtype=np.uint64)


def accept(
    relation: VoteRelation,
    challenge: Challenge,
    parties: list[str],
    guardian: VerifierShare,
    student: VerifierShare,
) -> NDArray[np.bool_]:
    """The guardian's decision from both verifiers' shares: (P,) True where valid."""
    sw = np.asarray(student.wire, dtype=np.uint64)
    sc = np.asarray(student.combined, dtype=np.uint64)
    if sw.shape != guardian.wire.shape or sc.shape != guardian.combined.shape:
        return np.zeros(len(parties), dtype=bool)
    malformed = (sw >= _P).any(axis=1) | (sc >= _P)
    f = field_add(guardian.wire, np.where(sw >= _P, np.uint64(0), sw))
    r, _ = challenge.coefficients(relation, f.shape[1], parties)
    square = _row_sums(field_mul(r, field_sub(field_mul(f, f), f)))
    total = field_sub(field_add(guardian.combined, np.where(sc >= _P, np.uint64(0), sc)), square)
    return np.asarray((total == 0) & ~malformed, dtype=bool)


# -- the link to the circuit's ring ------------------------------------------------------
def vote_shares(relation: VoteRelation, bit_shares: ArrayLike, weight: int) -> U64:
    """Shares of a party's votes (B, width) in F_p: its weight (on the shares' grid,
    an integer) times its counts."""
    if not 0 <= weight < P:
        raise ValidityError("a vote weight on the grid must lie in [0, p)")
    return field_mul(relation.counts(bit_shares), np.uint64(weight))


def conversion_failure(batch: int, width: int, teachers: Sequence[int]) -> float:
    """Upper bound on the probability that a round's conversion of its counts from F_p to
    Z_2^64 is off by one anywhere: ``batch`` queries of ``width`` counts, summed over
    parties whose counts are at most ``teachers`` each (their teachers, times 2^grid_bits
    on a fractional grid), each party's counts converted on their own.
    Data-independent: every argument is public when the round opens."""
    if batch < 0 or width < 0 or any(m < 0 for m in teachers):
        raise ValidityError("a conversion bound needs non-negative sizes")
    return float(batch) * float(width) * float(sum(m + 1 for m in teachers)) / float(P)


def conversion_delta(rounds: int) -> float:
    """What the ring conversion adds to a party's delta after it was asked to vote in
    ``rounds`` rounds, aborted ones included: at most MAX_CONVERSION_FAILURE each (the
    guardian refuses any round above it), so (eps, delta + rounds 2^-40) holds for the
    ledger's (eps, delta). Rounds without validity proofs are counted too: an
    over-count, never an under-count."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValidityError(f"a round count is a whole number >= 0, got {rounds!r}")
    return rounds * MAX_CONVERSION_FAILURE


def ring_shares(field_sum: ArrayLike, student: bool) -> U64:
    """A verifier's sum of vote shares in F_p -> its share in Z_2^64: the guardian's as is,
    the student's minus p (see the module docstring for the statistical error)."""
    s = np.asarray(field_sum, dtype=np.uint64)
    return s - _P if student else s.copy()


__all__ = [
    "MAX_CONVERSION_FAILURE",
    "MAX_ELEMENTS",
    "Challenge",
    "P",
    "ValidityError",
    "VerifierShare",
    "VoteRelation",
    "accept",
    "conversion_failure",
    "guardian_shares",
    "max_width",
    "prove",
    "ring_shares",
    "student_shares",
    "verifier_share",
    "vote_shares",
]
