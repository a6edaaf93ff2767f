"""Base OT, hash to curve, and IKNP extension."""

from __future__ import annotations

import os

import numpy as np
import pytest

from capc.mpc import ot
from capc.mpc.blocks import FixedKeyHash, transpose_bits
from capc.mpc.curve25519 import A, P, oblivious_point

# Order of the prime subgroup of Curve25519.
ELL = 2**252 + 27742317777372353535851937790883648493


def ladder_u(k: int, u: int) -> int | None:
    """x-only Montgomery ladder: u(k * Q), or None for the point at infinity."""
    x1, x2, z2, x3, z3 = u, 1, 0, u, 1
    a24 = (A + 2) // 4
    for t in reversed(range(k.bit_length())):
        bit = (k >> t) & 1
        if bit:
            x2, x3, z2, z3 = x3, x2, z3, z2
        a, b = (x2 + z2) % P, (x2 - z2) % P
        c, d = (x3 + z3) % P, (x3 - z3) % P
        da, cb = d * a % P, c * b % P
        x3, z3 = (da + cb) ** 2 % P, x1 * (da - cb) ** 2 % P
        aa, bb = a * a % P, b * b % P
        e = (aa - bb) % P
        x2, z2 = aa * bb % P, e * (bb + a24 * e) % P
        if bit:
            x2, x3, z2, z3 = x3, x2, z3, z2
    return None if z2 == 0 else x2 * pow(z2, P - 2, P) % P


def test_oblivious_points_lie_in_the_prime_order_subgroup() -> None:
    for _ in range(8):
        u = int.from_bytes(oblivious_point(os.urandom(32)), "little")
        assert (u**3 + A * u * u + u) % P != 0
        assert ladder_u(ELL, u) is None  # ell * Q is the identity
        assert ladder_u(ELL - 1, u) == u  # and Q itself is not


def test_oblivious_points_are_distinct_and_need_enough_randomness() -> None:
    assert len({oblivious_point(os.urandom(32)) for _ in range(20)}) == 20
    with pytest.raises(ValueError, match="32 random bytes"):
        oblivious_point(b"short")


def test_base_ot_delivers_the_chosen_message_only() -> None:
    choices = ot.random_choices(ot.KAPPA)
    receiver, request = ot.BaseOTReceiver.start(choices)
    pairs = ot.base_seeds()
    reply = ot.base_ot_send(pairs, request)
    got = receiver.finish(reply)
    for g, (m0, m1), c in zip(got, pairs, choices, strict=True):
        assert g == (m1 if c else m0)
        assert g != (m0 if c else m1)


def test_base_ot_rejects_malformed_messages() -> None:
    receiver, request = ot.BaseOTReceiver.start(ot.random_choices(4))
    with pytest.raises(ot.OTError, match="bytes"):
        ot.base_ot_send(ot.base_seeds()[:4], request[:-1])
    with pytest.raises(ot.OTError, match="bytes"):
        receiver.finish(b"\x00" * 10)
    with pytest.raises(ot.OTError, match="X25519"):
        ot.base_ot_send(ot.base_seeds()[:4], bytes(len(request)))  # all-zero keys


def test_bit_transpose_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2, (128, 1024), dtype=np.uint8)
    packed = np.packbits(bits, axis=1, bitorder="little")
    expect = np.packbits(np.ascontiguousarray(bits.T), axis=1, bitorder="little")
    np.testing.assert_array_equal(transpose_bits(packed, 128), expect)


def extension_pair() -> tuple[ot.ExtensionSender, ot.ExtensionReceiver]:
    s = ot.random_choices(ot.KAPPA)
    pairs = ot.base_seeds()
    hasher = FixedKeyHash()
    return ot.ExtensionSender(
        s, [p[c] for p, c in zip(pairs, s, strict=True)], hasher
    ), ot.ExtensionReceiver(pairs, hasher)


def test_extension_over_several_batches() -> None:
    sender, receiver = extension_pair()
    for m in (1, 127, 128, 1000, 5000):  # stream positions advance between batches
        choices = ot.random_choices(m)
        x0 = np.frombuffer(os.urandom(16 * m), dtype=np.uint64).reshape(m, 2)
        x1 = np.frombuffer(os.urandom(16 * m), dtype=np.uint64).reshape(m, 2)
        request, state = receiver.request(choices)
        reply = sender.respond(request, x0, x1)
        got = receiver.finish(state, reply)
        np.testing.assert_array_equal(got, np.where(choices[:, None].astype(bool), x1, x0))
        # What the receiver would compute for the other slot is unrelated to the other message.
        y = np.frombuffer(reply, dtype=np.uint64).reshape(m, 2, 2)
        chosen = choices[:, None].astype(bool)
        pad = got ^ np.where(chosen, y[:, 1], y[:, 0])
        naive_other = np.where(chosen, y[:, 0], y[:, 1]) ^ pad
        assert not (naive_other == np.where(chosen, x0, x1)).all(axis=1).any()


def test_extension_request_hides_the_choices() -> None:
    """The sender sees u = t ^ G(k1) ^ r: its bits must not correlate with the choice bits r."""
    _, receiver = extension_pair()
    m = 1 << 14
    choices = np.zeros(m, dtype=np.uint8)
    choices[m // 2 :] = 1
    request, _ = receiver.request(choices)
    u = np.unpackbits(
        np.frombuffer(request, dtype=np.uint8).reshape(ot.KAPPA, -1), axis=1, bitorder="little"
    )[:, :m]
    ones, zeros = u[:, choices == 1].mean(), u[:, choices == 0].mean()
    tolerance = 6 * 0.5 / np.sqrt(ot.KAPPA * m / 2)
    assert abs(ones - 0.5) < tolerance and abs(zeros - 0.5) < tolerance


def test_extension_rejects_wrong_sizes() -> None:
    sender, receiver = extension_pair()
    request, state = receiver.request(ot.random_choices(100))
    blocks = np.zeros((100, 2), dtype=np.uint64)
    with pytest.raises(ot.OTError, match="request"):
        sender.respond(request[:-16], blocks, blocks)
    with pytest.raises(ot.OTError, match="reply"):
        receiver.finish(state, b"\x00" * 31)
