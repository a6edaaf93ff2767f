"""Sealing share seeds to the student: X25519 + HKDF-SHA256 + AES-256-GCM.

An answering party seals each round's 128-bit seed to the student's public
key; the guardian relays the sealed box and cannot open it. The associated
data binds the box to its round and party, so a box replayed into another
round or attributed to another party fails to open.

Box layout: ephemeral public key (32 bytes) | nonce (12) | ciphertext + tag.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_INFO = b"capc/v1/sealed-seed"
OVERHEAD = 32 + 12 + 16


class SealError(ValueError):
    """A sealed box could not be opened: wrong key, wrong round or party, or altered."""


def _key(shared: bytes, ephemeral: bytes, recipient: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, ephemeral + recipient, _INFO).derive(shared)


def seal(recipient_public: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """Seal ``plaintext`` to a 32-byte X25519 public key, bound to ``associated`` data."""
    try:
        pub = X25519PublicKey.from_public_bytes(recipient_public)
    except ValueError as err:
        raise SealError("the recipient key is not a 32-byte X25519 public key") from err
    eph = X25519PrivateKey.generate()
    eph_pub = eph.public_key().public_bytes_raw()
    key = _key(eph.exchange(pub), eph_pub, recipient_public)
    nonce = os.urandom(12)
    return eph_pub + nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def open_sealed(recipient: X25519PrivateKey, box: bytes, associated: bytes) -> bytes:
    """Open a box made by :func:`seal` with the recipient's private key."""
    if len(box) < OVERHEAD:
        raise SealError(
            f"sealed box of {len(box)} bytes is shorter than its {OVERHEAD}-byte overhead"
        )
    eph_pub, nonce, body = box[:32], box[32:44], box[44:]
    try:
        shared = recipient.exchange(X25519PublicKey.from_public_bytes(eph_pub))
        key = _key(shared, eph_pub, recipient.public_key().public_bytes_raw())
        return AESGCM(key).decrypt(nonce, body, associated)
    except (InvalidTag, ValueError):
        raise SealError(
            "sealed box does not open: another recipient, round or party, or altered in transit"
        ) from None


def seed_context(round_id: int, party: str) -> bytes:
    """Associated data for a round's seed from ``party``."""
    return b"round:%d/party:%s" % (round_id, party.encode())
