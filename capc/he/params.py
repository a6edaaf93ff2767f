"""CKKS parameters: ring dimension, modulus chain and scales, and why they are safe.

Security: the total modulus (every prime of the chain, the special
key-switching prime included) must not exceed the bound that the
homomorphic encryption standard (Albrecht et al., 2018, Table 1, ternary
secret, classical 128-bit) gives for the ring dimension; SEAL checks the
same table again when the context is built (``SEC_LEVEL_TYPE.TC128``).

Precision: inputs and hidden layers run at scale 2^26 (each middle prime is
~2^26, and intermediate weights are encoded at exactly the prime they are
rescaled by, so the scale does not drift). The last layer is not rescaled:
rescaling adds rounding noise of about sqrt(N) * sqrt(N / 12) ~ 2^11 in the
slots and would leave only the first prime (43 bits) for the logits.
Instead its weights are encoded at 2^output_scale_bits / 2^26, the logits
come out at scale 2^41 at level 1, and the two primes left there (~2^69)
hold them.

Hiding does not use any of that room: the answering party masks the output
with a polynomial uniform modulo the whole output modulus Q (capc.he.masking),
so what the student decrypts is uniform whatever the logits' size. The room
sets the precision of the integer slot decoding that turns the two parties'
values into shares of the logits in the 2PC's ring: a decoding gain of
Q / (output scale * 2^(share_bits - frac_bits)), 2^14 by default, where the
decoder's error is about 2e-5 rms(logits) (bounds: MIN_GAIN_BITS,
MAX_GAIN_BITS).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: Bounds of CkksParams.decoding_gain_bits: below, the slot decoder's rounding shows in
#: the logits; above, the one-unit rounding of each of the N coefficients does.
MIN_GAIN_BITS = 12
MAX_GAIN_BITS = 30

#: Largest total modulus in bits for 128-bit security (HE standard, Table 1).
MAX_MODULUS_BITS_128: dict[int, int] = {
    1024: 27,
    2048: 54,
    4096: 109,
    8192: 218,
    16384: 438,
    32768: 881,
}


@dataclass(frozen=True)
class CkksParams:
    """One CKKS parameter set.

    ``coeff_bits``: bit sizes of the modulus chain, first (decryption) prime
    first and the special key-switching prime last; the middle primes are the
    multiplicative levels. ``scale_bits``: log2 of the input scale.
    ``output_scale_bits``: log2 of the logits' scale after the last layer.
    ``share_bits`` and ``frac_bits``: the logits' fixed point in the
    logits-to-shares 2PC (two's complement, ``frac_bits`` fractional bits), so
    logits of magnitude below 2^(share_bits - frac_bits - 1) compare correctly.
    """

    poly_modulus_degree: int = 8192
    coeff_bits: tuple[int, ...] = (43, 26, 26, 26, 26, 26, 45)
    scale_bits: int = 26
    output_scale_bits: int = 41
    share_bits: int = 24
    frac_bits: int = 10

    def __post_init__(self) -> None:
        n = self.poly_modulus_degree
        if n not in MAX_MODULUS_BITS_128:
            raise ValueError(
                f"poly_modulus_degree must be one of {sorted(MAX_MODULUS_BITS_128)}, got {n}"
            )
        if len(self.coeff_bits) < 3:
            raise ValueError("the modulus chain needs a first prime, a level and a special prime")
        if not all(17 <= b <= 60 for b in self.coeff_bits):
            raise ValueError(f"every prime must have 17 to 60 bits, got {self.coeff_bits}")
        if self.total_bits > MAX_MODULUS_BITS_128[n]:
            raise ValueError(
                f"{self.total_bits} modulus bits exceed the 128-bit bound "
                f"{MAX_MODULUS_BITS_128[n]} for N={n}; use fewer levels or a larger ring"
            )
        if self.scale_bits > min(self.coeff_bits[1:-1]) + 1:
            raise ValueError("the scale must not exceed the level primes")
        if not 2 <= self.frac_bits < self.share_bits <= 40:
            raise ValueError(
                f"need 2 <= frac_bits < share_bits <= 40, got {self.frac_bits} and {self.share_bits}"
            )
        if not MIN_GAIN_BITS <= self.decoding_gain_bits <= MAX_GAIN_BITS:
            raise ValueError(
                f"the output modulus ({self.output_modulus_bits} bits), output scale "
                f"2^{self.output_scale_bits} and a {self.share_bits}-bit share ring with "
                f"{self.frac_bits} fractional bits give a slot-decoding gain of "
                f"2^{self.decoding_gain_bits}; it must lie in 2^{MIN_GAIN_BITS}..2^{MAX_GAIN_BITS} "
                "(change output_scale_bits or share_bits)"
            )

    @property
    def total_bits(self) -> int:
        """Bits of the whole modulus chain, special prime included."""
        return sum(self.coeff_bits)

    @property
    def output_level(self) -> int:
        """Level of the returned logits: the first two primes are left."""
        return 1

    @property
    def output_modulus_bits(self) -> int:
        """Bits of the modulus at the output level (first prime and one level prime)."""
        return sum(self.coeff_bits[: self.output_level + 1])

    @property
    def slots(self) -> int:
        """Values per ciphertext (N / 2)."""
        return self.poly_modulus_degree // 2

    @property
    def depth(self) -> int:
        """Rescalings from the input level down to the output level."""
        return self.input_level - self.output_level

    @property
    def input_level(self) -> int:
        """Level of freshly encrypted queries (all middle primes left)."""
        return len(self.coeff_bits) - 2

    @property
    def decoding_gain_bits(self) -> int:
        """log2 (rounded) of the integer slot decoder's gain over one fixed-point unit.

        The decoder's rounding error is about 0.3 rms(logits) / 2^gain logit units.
        """
        return (
            self.output_modulus_bits - self.output_scale_bits - (self.share_bits - self.frac_bits)
        )

    @property
    def max_logit(self) -> float:
        """Largest logit magnitude the share ring represents: 2^(share_bits - frac_bits - 1)."""
        return float(2 ** (self.share_bits - self.frac_bits - 1))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["coeff_bits"] = list(self.coeff_bits)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CkksParams:
        known = {
            "poly_modulus_degree",
            "coeff_bits",
            "scale_bits",
            "output_scale_bits",
            "share_bits",
            "frac_bits",
        }
        if "mask_bits" in d:
            raise ValueError(
                "mask_bits is no longer a CKKS parameter: the mask is uniform over the whole "
                "output modulus, whatever the logits' size; remove it from the task"
            )
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown CKKS parameters {sorted(unknown)}")
        kw = dict(d)
        if "coeff_bits" in kw:
            kw["coeff_bits"] = tuple(int(b) for b in kw["coeff_bits"])
        return cls(**kw)


DEFAULT_PARAMS = CkksParams()
