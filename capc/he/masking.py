"""Hiding the teacher's logits from the student, and turning them into shares for the 2PC.

The answering party adds to each output ciphertext (at the output level,
modulus Q = q_0 * ... * q_L, degree N)

1. a fresh public-key encryption of zero. Before it, the ciphertext's
   second part is a fixed linear function of the student's ciphertexts and
   the party's weights; after it, that part is a fresh RLWE sample.
2. a polynomial u whose N coefficients are uniform modulo Q, exactly
   (uniform residues modulo every prime, by rejection sampling), added to
   the first part in the coefficient domain.

The student decrypts v + u mod Q, where v is everything the evaluation put
in the plaintext: logits at scale Delta, CKKS error, and whatever a deviating
student's queries made of them, of any size. Since u is uniform modulo Q
and independent of v, so is v + u: the decrypted polynomial is uniform
(statistical distance 0 from a polynomial the student could draw itself),
every slot of it, paid for or not. The ciphertext's second part is fresh,
so the ciphertext says nothing more than its decryption (RLWE).

Shares of the logits, without floating point: the student holds a = v + u
and the party b = -u, both modulo Q, with a + b = v. Each side maps its
value to Z_2^64 by x -> floor(x 2^64 / Q) coefficient by coefficient; the
two results add up to v 2^64 / Q, off by at most one unit, and the map
needs no bound on v (Z_Q and Z_2^64 are both circles). Each side then
applies the same integer decoding matrix D, D[s, i] = round(c cos(pi i k_s
/ N)) with k_s = 3^s mod 2N the root of slot s, and c chosen so that one
logit unit comes out as 2^(64 - share_bits + frac_bits) (:class:`SlotDecoder`).
Sums modulo 2^64 commute with the integer matrix, so the two decoded
values add up to the slot's real part in fixed point. Both sides shift
right by 64 - share_bits: shares in Z_2^share_bits of round(z 2^frac_bits),
off by at most one unit plus the decoder's rounding (about 0.3 rms(z) /
2^decoding_gain_bits logit units). The table is computed in exact decimal
arithmetic, so two machines with different math libraries build the same D.

Only the slots a round pays for are decoded: the first B of each of the K
batched logit ciphertexts, or slots 0..K-1 of each single-query output.
Whatever else a student packs into a ciphertext comes back uniform and is
never decoded. In the logits-to-shares circuit
(:class:`capc.mpc.mechanism_circuits.LogitsToSharesCircuit`) the student's input is
its share y and the party's "mask" is minus its share, so y - mask is the logit.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from decimal import ROUND_HALF_EVEN, Decimal, localcontext

import numpy as np
import tenseal.sealapi as seal
from numpy.typing import NDArray

from capc.he.ckks import HeError, PublicContext, StudentKeys, _Context, read_polys
from capc.he.params import CkksParams
from capc.mpc import ring
from capc.privacy.randomness import SecureRandom

#: Slots decoded per matrix block: bounds the decoder's memory to block * N * 8 bytes.
DECODE_BLOCK = 256


def uniform_residues(rng: SecureRandom, moduli: Sequence[int], n: int) -> NDArray[np.uint64]:
    """(len(moduli), n) integers, row l uniform in [0, moduli[l]) exactly (rejection sampling).

    Uniform residues modulo every prime are, by the CRT, a uniform integer modulo their product.
    """
    out = np.empty((len(moduli), n), dtype=np.uint64)
    for row, q in enumerate(moduli):
        keep = np.uint64((1 << (q - 1).bit_length()) - 1)
        filled = 0
        while filled < n:
            # at least half of the masked words are below q; draw twice what is missing
            draw = rng.uint64(2 * (n - filled) + 16) & keep
            ok = draw[draw < np.uint64(q)][: n - filled]
            out[row, filled : filled + len(ok)] = ok
            filled += len(ok)
    return out


def mask_ciphertext(
    ctx: PublicContext, ct: seal.Ciphertext, rng: SecureRandom
) -> NDArray[np.uint64]:
    """Re-randomise ``ct`` and add a mask uniform modulo its whole modulus, in place.

    Returns the mask's residues (primes, N), coefficient form.
    """
    level = ctx.level(ct)
    moduli = ctx.moduli(level)
    zero = seal.Ciphertext(ctx.context)
    ctx.encryptor.encrypt_zero(ct.parms_id(), zero)
    ctx.evaluator.transform_from_ntt_inplace(zero)
    parts = read_polys(zero)
    u = uniform_residues(rng, moduli, ctx.params.poly_modulus_degree)
    q = np.asarray(moduli, dtype=np.uint64)[:, None]
    # residues < 2^61: the sum cannot overflow 64 bits
    parts[0] = (parts[0] + u) % q
    masked = ctx.ciphertext(parts, level, ct.scale, ntt=False)
    ctx.evaluator.transform_to_ntt_inplace(masked)
    ctx.evaluator.add_inplace(ct, masked)
    return u


def lift(residues: NDArray[np.uint64], moduli: Sequence[int]) -> NDArray[np.uint64]:
    """(..., primes, N) residues of x in [0, Q) -> floor(x 2^64 / Q) as uint64 (..., N)."""
    r = np.asarray(residues, dtype=np.uint64)
    if r.shape[-2] != len(moduli):
        raise HeError(f"need residues for {len(moduli)} primes, got {r.shape[-2]}")
    total = 1
    for q in moduli:
        total *= q
    # CRT with Python integers: N values a ciphertext, a handful of vectorised object ops
    x = np.zeros(r.shape[:-2] + r.shape[-1:], dtype=object)
    for row, q in enumerate(moduli):
        m = total // q
        x = x + r[..., row, :].astype(object) * (m * pow(m, -1, q))
    x = x % total
    return np.asarray((x << 64) // total, dtype=np.uint64)


def negated(residues: NDArray[np.uint64], moduli: Sequence[int]) -> NDArray[np.uint64]:
    """-x mod Q, residue by residue (primes on axis -2)."""
    q = np.asarray(moduli, dtype=np.uint64)[:, None]
    return (q - residues % q) % q


@functools.lru_cache(maxsize=8)
def _cos_table(n: int, numerator: int, shift: int) -> NDArray[np.uint64]:
    """round(numerator cos(pi j / n) / 2^shift) for j in [0, 2n), two's complement in uint64.

    Exact decimal arithmetic (60 digits, the Chebyshev recurrence from cos(pi / n)),
    so every machine builds the same integers.
    """
    with localcontext() as dc:
        dc.prec = 60
        pi = _decimal_pi()
        theta = pi / n
        # cos(theta) by its Taylor series: theta <= pi / 1024, a few terms reach 60 digits
        term, c1, k = Decimal(1), Decimal(1), 0
        while True:
            k += 2
            term = -term * theta * theta / (k * (k - 1))
            if abs(term) < Decimal(10) ** -70:
                break
            c1 += term
        half = n // 2
        cos = [Decimal(1), c1]
        for _ in range(2, half + 1):
            cos.append(2 * c1 * cos[-1] - cos[-2])
        cos[half] = Decimal(0)
        scale = Decimal(numerator) / (Decimal(2) ** shift)
        quarter = [int((scale * v).to_integral_value(rounding=ROUND_HALF_EVEN)) for v in cos]
    q = np.asarray(quarter, dtype=np.int64)
    # cos(pi (n - j) / n) = -cos(pi j / n) gives j in [0, n]; cos(pi (2n - j) / n) the rest
    upto_n = np.concatenate([q, -q[half - 1 :: -1]])
    return np.concatenate([upto_n, upto_n[1:n][::-1]]).astype(np.uint64)


@functools.cache
def _decimal_pi() -> Decimal:
    """pi to 60 digits by Machin's formula, 4 (4 atan(1/5) - atan(1/239))."""
    with localcontext() as dc:
        dc.prec = 70

        def atan_inv(x: int) -> Decimal:
            power, total, k = Decimal(1) / x, Decimal(0), 0
            x2 = x * x
            while power > Decimal(10) ** -72:
                total += (power / (2 * k + 1)) * (-1 if k % 2 else 1)
                power /= x2
                k += 1
            return total

        return 4 * (4 * atan_inv(5) - atan_inv(239))


class SlotDecoder:
    """The integer slot decoding both sides apply to their lifted values (module docstring)."""

    def __init__(self, params: CkksParams, moduli: Sequence[int]) -> None:
        self.params = params
        self.moduli = tuple(moduli)
        self.n = params.poly_modulus_degree
        total = 1
        for q in self.moduli:
            total *= q
        # one logit unit -> 2^(64 - share_bits + frac_bits) after lifting by 2^64 / Q:
        # c = Q 2^(frac_bits - share_bits) / Delta
        shift = params.share_bits - params.frac_bits + params.output_scale_bits
        self.table = _cos_table(self.n, total, shift)
        self.shift = np.uint64(64 - params.share_bits)
        self._roots = np.array([pow(3, s, 2 * self.n) for s in range(params.slots)], np.int64)

    def matrix(self, start: int, stop: int) -> NDArray[np.uint64]:
        """Rows ``start..stop-1`` of D: (stop - start, N) uint64."""
        i = np.arange(self.n, dtype=np.int64)
        index = (self._roots[start:stop, None] * i[None, :]) % (2 * self.n)
        rows: NDArray[np.uint64] = self.table[index]
        return rows

    def decode(self, lifted: NDArray[np.uint64], slots: int) -> NDArray[np.uint64]:
        """(C, N) lifted values -> (C, slots) shares in Z_2^share_bits of the first ``slots`` slots."""
        x = np.asarray(lifted, dtype=np.uint64)
        if x.ndim != 2 or x.shape[1] != self.n or not 1 <= slots <= self.params.slots:
            raise HeError(f"need (C, {self.n}) lifted values and 1..{self.params.slots} slots")
        out = np.empty((x.shape[0], slots), dtype=np.uint64)
        for start in range(0, slots, DECODE_BLOCK):
            stop = min(slots, start + DECODE_BLOCK)
            # uint64 products and sums wrap modulo 2^64, as the shares do
            out[:, start:stop] = x @ self.matrix(start, stop).T
        return out >> self.shift


@functools.lru_cache(maxsize=4)
def _decoder(params: CkksParams, moduli: tuple[int, ...]) -> SlotDecoder:
    return SlotDecoder(params, moduli)


def decoder(ctx: _Context) -> SlotDecoder:
    """The slot decoder of ``ctx``'s output level (built once per parameter set)."""
    return _decoder(ctx.params, ctx.moduli(ctx.params.output_level))


def party_masks(ctx: PublicContext, masks: NDArray[np.uint64], slots: int) -> NDArray[np.uint64]:
    """(C, primes, N) mask residues -> (C, slots) garbler masks: minus the party's shares."""
    dec = decoder(ctx)
    share = dec.decode(lift(negated(masks, dec.moduli), dec.moduli), slots)
    return ring.reduce(np.uint64(0) - share, ctx.params.share_bits)


def student_values(
    keys: StudentKeys, outputs: Sequence[seal.Ciphertext], slots: int
) -> NDArray[np.uint64]:
    """C masked ciphertexts -> (C, slots) student shares (its 'masked logits')."""
    dec = decoder(keys)
    coeffs = np.stack([keys.decrypt_coefficients(ct) for ct in outputs])
    return ring.reduce(dec.decode(lift(coeffs, dec.moduli), slots), keys.params.share_bits)


def mask_batched(
    ctx: PublicContext, logits: list[seal.Ciphertext], batch: int, rng: SecureRandom
) -> NDArray[np.uint64]:
    """Mask K batched logit ciphertexts in place; returns the party's (batch, K) garbler masks."""
    masks = np.stack([mask_ciphertext(ctx, ct, rng) for ct in logits])
    return party_masks(ctx, masks, batch).T.copy()


def mask_single(
    ctx: PublicContext, logits: list[seal.Ciphertext], num_classes: int, rng: SecureRandom
) -> NDArray[np.uint64]:
    """Mask B single-query logit ciphertexts in place; returns the party's (B, K) garbler masks."""
    masks = np.stack([mask_ciphertext(ctx, ct, rng) for ct in logits])
    return party_masks(ctx, masks, num_classes)


def masked_batched(
    keys: StudentKeys, logits: Sequence[seal.Ciphertext], batch: int
) -> NDArray[np.uint64]:
    """The student's (batch, K) values of K masked batched logit ciphertexts."""
    return student_values(keys, logits, batch).T.copy()


def masked_single(
    keys: StudentKeys, logits: Sequence[seal.Ciphertext], num_classes: int
) -> NDArray[np.uint64]:
    """The student's (B, K) values of B masked single-query logit ciphertexts."""
    return student_values(keys, logits, num_classes)


def to_logits(values: NDArray[np.uint64], params: CkksParams) -> NDArray[np.float64]:
    """Reconstructed shares (student value - party mask, mod 2^share_bits) -> logits, signed."""
    return ring.decode_fixed(values, params.frac_bits, params.share_bits)
