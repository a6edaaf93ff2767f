"""Seeds sealed to the student open only for the student, in their own round, from their own party."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from capc.mpc import ring
from capc.mpc.sealing import OVERHEAD, SealError, open_sealed, seal, seed_context


def test_round_trip_and_size() -> None:
    student = X25519PrivateKey.generate()
    seed = ring.new_seed()
    box = seal(student.public_key().public_bytes_raw(), seed, seed_context(7, "hospital-a"))
    assert len(box) == len(seed) + OVERHEAD
    assert seed not in box
    assert open_sealed(student, box, seed_context(7, "hospital-a")) == seed


@pytest.mark.parametrize(
    "change",
    ["other-key", "other-round", "other-party", "flipped", "truncated"],
)
def test_box_refuses_everything_else(change: str) -> None:
    student = X25519PrivateKey.generate()
    box = seal(
        student.public_key().public_bytes_raw(), ring.new_seed(), seed_context(7, "hospital-a")
    )
    key, ctx = student, seed_context(7, "hospital-a")
    if change == "other-key":
        key = X25519PrivateKey.generate()  # the guardian relaying it holds no usable key
    elif change == "other-round":
        ctx = seed_context(8, "hospital-a")
    elif change == "other-party":
        ctx = seed_context(7, "hospital-b")
    elif change == "flipped":
        box = box[:-1] + bytes([box[-1] ^ 1])
    else:
        box = box[:20]
    with pytest.raises(SealError):
        open_sealed(key, box, ctx)


def test_bad_recipient_key() -> None:
    with pytest.raises(SealError, match="X25519"):
        seal(b"short", b"x", b"")
