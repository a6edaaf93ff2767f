"""Base OT, hash to curve, and IKNP extension."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest

from capc.mpc import ot
from capc.mpc.blocks import FixedKeyHash, transpose_bits
from capc.mpc.channel import ProtocolError
from capc.mpc.curve25519 import A, P, oblivious_point
from tests.unit.mpc.deviating import deviate

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


def extension_pair(
    make_receiver: Callable[[list[tuple[bytes, bytes]], FixedKeyHash], ot.ExtensionReceiver] = (
        ot.ExtensionReceiver
    ),
) -> tuple[np.ndarray, ot.ExtensionSender, ot.ExtensionReceiver]:
    """The sender's secret s (128 bits), the sender, and a receiver built by ``make_receiver``."""
    s = ot.random_choices(ot.KAPPA)
    pairs = ot.base_seeds()
    hasher = FixedKeyHash()
    sender = ot.ExtensionSender(s, [p[c] for p, c in zip(pairs, s, strict=True)], hasher)
    return s, sender, make_receiver(pairs, hasher)


def random_messages(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays of m random blocks, (m, 2) each."""
    x0 = np.frombuffer(os.urandom(16 * m), dtype=np.uint64).reshape(m, 2)
    x1 = np.frombuffer(os.urandom(16 * m), dtype=np.uint64).reshape(m, 2)
    return x0, x1


def test_extension_over_several_batches() -> None:
    _, sender, receiver = extension_pair()
    for m in (1, 127, 128, 1000, 5000, 0, 64):  # stream positions advance between batches
        choices = ot.random_choices(m)
        x0, x1 = random_messages(m)
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
    _, _, receiver = extension_pair()
    m = 1 << 14
    choices = np.zeros(m, dtype=np.uint8)
    choices[m // 2 :] = 1
    request, _ = receiver.request(choices)
    u = np.unpackbits(
        np.frombuffer(request[: -ot.CHECK_BYTES], dtype=np.uint8).reshape(ot.KAPPA, -1),
        axis=1,
        bitorder="little",
    )[:, :m]
    ones, zeros = u[:, choices == 1].mean(), u[:, choices == 0].mean()
    tolerance = 6 * 0.5 / np.sqrt(ot.KAPPA * m / 2)
    assert abs(ones - 0.5) < tolerance and abs(zeros - 0.5) < tolerance


def test_extension_rejects_wrong_sizes() -> None:
    _, sender, receiver = extension_pair()
    request, state = receiver.request(ot.random_choices(100))
    blocks = np.zeros((100, 2), dtype=np.uint64)
    with pytest.raises(ot.OTError, match="request"):
        sender.respond(request[:-16], blocks, blocks)
    with pytest.raises(ot.OTError, match="reply"):
        receiver.finish(state, b"\x00" * 31)


def test_check_answer_hides_the_choices() -> None:
    """x = sum chi_j r_j is uniform thanks to the check's random extra choices.

    With every real choice 1, then every one 0, the bits of x must be balanced.
    """
    bits = []
    for fill in (0, 1):
        _, _, receiver = extension_pair()
        for _ in range(40):
            request, _ = receiver.request(np.full(300, fill, dtype=np.uint8))
            x = request[-ot.CHECK_BYTES : -ot.CHECK_BYTES // 2]
            bits.append(np.unpackbits(np.frombuffer(x, dtype=np.uint8)))
    x_bits = np.array(bits)
    tolerance = 6 * 0.5 / np.sqrt(x_bits[:40].size)
    assert abs(x_bits[:40].mean() - 0.5) < tolerance and abs(x_bits[40:].mean() - 0.5) < tolerance
    assert len({row.tobytes() for row in x_bits}) == len(x_bits)


def test_check_costs_a_constant_per_batch() -> None:
    """At most 319 extra OTs (16 bytes each) and 32 bytes for (x, t), whatever the batch size."""
    for m in (0, 1, 64, 65, 128, 10_000, 153_600):
        extra = ot.request_bytes(m) - 16 * m
        assert 16 * ot.CHECK_OTS + ot.CHECK_BYTES <= extra <= 16 * 319 + ot.CHECK_BYTES


# -- a deviating receiver (the student) ------------------------------------------------


def test_a_column_deviation_is_caught_whenever_it_would_leak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deviating in column i leaks s_i only through the OTs that fail when s_i = 1.

    The check must catch exactly those runs (and raise no false alarm when
    s_i = 0, where the deviation changes nothing the sender computes).
    """
    m, row = 200, 5
    caught = np.zeros(ot.KAPPA, dtype=bool)
    secret = np.zeros(ot.KAPPA, dtype=bool)
    for i in range(ot.KAPPA):
        s, sender, receiver = extension_pair()
        deviate(monkeypatch, receiver, [i], row)
        secret[i] = bool(s[i])
        choices = ot.random_choices(m)
        x0, x1 = random_messages(m)
        request, state = receiver.request(choices)
        try:
            reply = sender.respond(request, x0, x1)
        except ProtocolError as err:
            assert "consistency check" in str(err)
            caught[i] = True
            continue
        got = receiver.finish(state, reply)
        np.testing.assert_array_equal(got, np.where(choices[:, None].astype(bool), x1, x0))
    np.testing.assert_array_equal(caught, secret)
    assert secret.any()  # 2^-128 that the test exercised nothing


def test_deviating_in_many_columns_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Learning many bits of s at once is caught unless every one of them is 0."""
    _, sender, receiver = extension_pair()
    deviate(monkeypatch, receiver, range(0, ot.KAPPA, 2), 3)
    request, _ = receiver.request(ot.random_choices(1000))
    with pytest.raises(ProtocolError, match="consistency check"):
        sender.respond(request, *random_messages(1000))


def test_a_failed_check_closes_the_sender(monkeypatch: pytest.MonkeyPatch) -> None:
    """Answering again after a failed check would let the receiver guess bit after bit."""
    _, sender, receiver = extension_pair()
    deviate(monkeypatch, receiver, range(ot.KAPPA), 0)
    request, _ = receiver.request(ot.random_choices(10))
    with pytest.raises(ProtocolError, match="consistency check"):
        sender.respond(request, *random_messages(10))
    monkeypatch.undo()  # from now on honest
    request, _ = receiver.request(ot.random_choices(10))
    with pytest.raises(ProtocolError, match="failed"):
        sender.respond(request, *random_messages(10))
