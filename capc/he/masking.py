"""What an answering party does to its encrypted logits before the student may decrypt them.

To each output ciphertext the party adds

1. a fresh public-key encryption of zero. Before it, the ciphertext's
   second part is a fixed linear function of the student's ciphertexts and
   the party's weights; after it, both parts are fresh RLWE samples, so the
   ciphertext says nothing beyond what it decrypts to.
2. a plaintext mask r whose slots have real and imaginary parts uniform in
   [-F, F], F = 2^mask_bits logit units (2^26 by default). Decoding is a
   bijection between the decrypted polynomial and its slots, so what the
   student sees is z + r + e, z the logits and e the CKKS error, in every
   slot, real and imaginary parts alike. For one value v = z + e, the
   distributions of r and v + r differ by |v| / (2F) in statistical
   distance: at most 2^-21 for |v| <= 64 with F = 2^26. The encoding
   rounds r to the plaintext's integer coefficients; the party reads its
   mask back by decoding its own plaintext, so the mask it keeps is the
   one that was added.

The student then holds Re(z + r + e) and the party Re(r) in the logit slots;
:func:`to_fixed` turns both into integers mod 2^bits for the
logits-to-shares circuit (:class:`capc.mpc.mechanism_circuits.LogitsToShares`),
which subtracts the mask inside the garbled circuit.
"""

from __future__ import annotations

import numpy as np
import tenseal.sealapi as seal
from numpy.typing import ArrayLike, NDArray

from capc.he.ckks import PublicContext
from capc.privacy.randomness import SecureRandom

#: Fixed point of the masked logits in the 2PC: 10 fractional bits, 24 bits in all,
#: so logits of magnitude up to 2^12 compare correctly as signed integers.
FRAC_BITS = 10
FIXED_BITS = 24


def mask_ciphertext(
    ctx: PublicContext, ct: seal.Ciphertext, rng: SecureRandom
) -> NDArray[np.complex128]:
    """Re-randomise and mask ``ct`` in place; returns the mask of every slot, (N/2,) complex.

    ``ct`` must be at the output level (its scale is the logits' scale).
    """
    bound = float(2**ctx.params.mask_bits)
    n = ctx.params.slots
    r = (2.0 * rng.uniform((2, n)) - 1.0) * bound
    mask = (r[0] + 1j * r[1]).tolist()
    pid = ct.parms_id()
    zero = seal.Ciphertext(ctx.context)
    ctx.encryptor.encrypt_zero(pid, zero)
    zero.scale = ct.scale
    ctx.evaluator.add_inplace(ct, zero)
    pt = seal.Plaintext()
    ctx.encoder.encode(mask, pid, ct.scale, pt)
    ctx.evaluator.add_plain_inplace(ct, pt)
    return np.asarray(ctx.encoder.decode_complex(pt), dtype=np.complex128)


def to_fixed(
    values: ArrayLike, frac_bits: int = FRAC_BITS, bits: int = FIXED_BITS
) -> NDArray[np.uint64]:
    """Real values -> round(v * 2^frac_bits) mod 2^bits as uint64, any shape.

    Both sides convert: the student its decrypted masked logits, the party
    its mask; their difference mod 2^bits is the logit in fixed point, off by
    at most one unit of rounding plus the CKKS error.
    """
    v = np.asarray(values, dtype=np.float64)
    if not np.isfinite(v).all():
        raise ValueError("masked logits must be finite")
    scaled = np.rint(v * float(2**frac_bits))
    # |scaled| < 2^53 here (mask 2^26 times 2^10): exact in float64 and in int64
    wrapped = np.mod(scaled, float(2**bits))
    return wrapped.astype(np.uint64)


def mask_batched(
    ctx: PublicContext, logits: list[seal.Ciphertext], batch: int, rng: SecureRandom
) -> NDArray[np.float64]:
    """Mask K batched logit ciphertexts in place; returns the party's (batch, K) masks."""
    return np.stack([mask_ciphertext(ctx, ct, rng)[:batch].real for ct in logits], axis=1)


def mask_single(
    ctx: PublicContext, logits: seal.Ciphertext, num_classes: int, rng: SecureRandom
) -> NDArray[np.float64]:
    """Mask a single-query logit ciphertext in place; returns the party's (1, K) mask."""
    return mask_ciphertext(ctx, logits, rng)[None, :num_classes].real
