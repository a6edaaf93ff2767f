"""The sealed student-party channel the guardian relays (services.common.relay)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from services.common.relay import CHUNK, RelayChannel, RelayError, relay_session_id


def pair(round_id: int = 7, party: str = "hospital-a"):  # type: ignore[no-untyped-def]
    student = X25519PrivateKey.generate()
    wire: dict[str, list[bytes]] = {"to_student": [], "to_party": []}
    p, hello = RelayChannel.for_party(
        student.public_key().public_bytes_raw(), round_id, party, wire["to_student"].append
    )
    s = RelayChannel.for_student(student, hello, round_id, party, wire["to_party"].append)
    return s, p, wire, hello


def deliver(wire: list[bytes], to: RelayChannel) -> None:
    for frame in wire:
        to.feed(frame)
    wire.clear()


def test_frames_and_blobs_cross_both_ways() -> None:
    s, p, wire, _ = pair()
    s.send(b"hello party")
    blob = bytes(range(256)) * (3 * CHUNK // 256 + 5)
    s.send_blob(blob)
    deliver(wire["to_party"], p)
    assert p.recv(1) == b"hello party"
    assert p.recv_blob(10 * CHUNK, 1) == blob
    p.send(b"logits")
    deliver(wire["to_student"], s)
    assert s.recv(1) == b"logits"


def test_the_relay_sees_only_ciphertext_and_cannot_alter_replay_or_move_frames() -> None:
    s, p, wire, hello = pair()
    s.send(b"secret ciphertexts")
    (frame,) = wire["to_party"]
    assert b"secret" not in frame
    p.feed(frame[:-1] + bytes([frame[-1] ^ 1]))
    with pytest.raises(RelayError, match="does not open"):
        p.recv(1)
    s2, p2, wire2, _ = pair()
    s2.send(b"first")
    s2.send(b"second")
    _, second = wire2["to_party"]
    p2.feed(second)  # out of order
    with pytest.raises(RelayError, match="does not open"):
        p2.recv(1)
    # a frame of round 7 fed to the same party's channel of round 8
    student = X25519PrivateKey.generate()
    other, _ = RelayChannel.for_party(
        student.public_key().public_bytes_raw(), 8, "hospital-a", print
    )
    other.feed(frame)
    with pytest.raises(RelayError, match="does not open"):
        other.recv(1)
    assert relay_session_id(7, "hospital-a", hello) != relay_session_id(7, "hospital-b", hello)


def test_limits_timeouts_and_closed_relays() -> None:
    s, p, wire, _ = pair()
    s.send_blob(b"x" * 100)
    deliver(wire["to_party"], p)
    with pytest.raises(RelayError, match="exceeds the limit"):
        p.recv_blob(10, 1)
    _, p = pair()[:2]
    with pytest.raises(RelayError, match="sent nothing"):
        p.recv(0.01)
    p.feed(None)
    with pytest.raises(RelayError, match="closed"):
        p.recv(1)
    with pytest.raises(RelayError, match="X25519"):
        RelayChannel.for_party(b"short", 1, "hospital-a", print)
