"""The audit log's hash chain and the signed heads that pin it.

Every ledger change appends an entry whose hash covers the previous hash,
so altering, inserting or removing an entry breaks every later link. A chain
on its own can be recomputed by whoever can write the database; so the
guardian also signs each head (the chain's hash after an entry) with its own
Ed25519 key, which is never stored in the database, and every answering
party keeps the signed head it was shown each round. A rewritten history
then fails a signature, or disagrees with a head a hospital holds
(``capc audit verify``).

A signature covers ``HEAD_DOMAIN || seq (8 bytes, big-endian) || hash (32 bytes)``.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

GENESIS = "0" * 64
HEAD_DOMAIN = b"capc audit head v1\x00"


class AuditKeyError(Exception):
    """An audit signing key is missing, unreadable or malformed; the text says what to do."""


@dataclass(frozen=True)
class AuditHead:
    """The chain's head after entry ``seq``: its hash (hex SHA-256) and the guardian's
    Ed25519 signature of (seq, hash) (hex; empty where the ledger has no key)."""

    seq: int
    hash: str
    signature: str

    def to_dict(self) -> dict[str, object]:
        return {"seq": self.seq, "hash": self.hash, "signature": self.signature}


class ChainRow(Protocol):
    """What the chain check reads of an audit entry."""

    seq: int
    at: dt.datetime
    actor: str
    action: str
    detail: dict[str, object]
    prev_hash: str
    hash: str
    note: str | None
    signature: str | None


def digest(
    prev: str,
    seq: int,
    at: dt.datetime,
    actor: str,
    action: str,
    detail: Mapping[str, object],
    note: str | None = None,
) -> str:
    """The hash of one entry, chained to ``prev``. Entries without a note hash exactly as
    they did before notes existed, so older chains still verify."""
    fields: list[object] = [seq, at.isoformat(), actor, action, dict(detail)]
    if note is not None:
        fields.append(note)
    body = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256((prev + body).encode()).hexdigest()


def head_message(seq: int, head_hash: str) -> bytes:
    """The bytes a head's signature covers."""
    return HEAD_DOMAIN + seq.to_bytes(8, "big") + bytes.fromhex(head_hash)


def sign_head(key: Ed25519PrivateKey, seq: int, head_hash: str) -> str:
    """Hex Ed25519 signature of the head (seq, hash)."""
    return key.sign(head_message(seq, head_hash)).hex()


def public_hex(key: Ed25519PrivateKey) -> str:
    """The raw 32-byte public key of ``key``, hex."""
    return key.public_key().public_bytes_raw().hex()


@functools.lru_cache(maxsize=16)
def _public_key(public_key: str) -> Ed25519PublicKey:
    """The key of ``public_key`` (hex), parsed once: a party checks a head every round."""
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key))


def head_signed(public_key: str, head: AuditHead) -> bool:
    """True when ``head.signature`` is a valid signature of the head by ``public_key`` (hex)."""
    try:
        pub = _public_key(public_key)
        pub.verify(bytes.fromhex(head.signature), head_message(head.seq, head.hash))
    except (InvalidSignature, ValueError):
        return False
    return True


def load_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM file ``path``."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise AuditKeyError(
            f"no audit signing key at {path}; `capc pki issue --role guardian` writes one "
            "beside the guardian's certificate, or start the guardian with --audit-key PATH"
        ) from None
    except (OSError, ValueError) as err:
        raise AuditKeyError(f"cannot read the audit signing key {path}: {err}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise AuditKeyError(f"{path} holds no Ed25519 key; the audit log is signed with Ed25519")
    return key


def create_key(path: Path) -> Ed25519PrivateKey:
    """A new Ed25519 key written to ``path`` (PKCS#8 PEM, mode 0600); refuses to overwrite."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise AuditKeyError(f"{path} exists; an audit key is never overwritten") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return key


@dataclass(frozen=True)
class ChainProblem:
    """The first entry at which a chain check failed, and why."""

    seq: int
    reason: str

    def __str__(self) -> str:
        return f"audit entry {self.seq}: {self.reason}"


def check_chain(
    rows: Iterable[ChainRow], public_key: str | None, signed_from: int = 0
) -> tuple[int, ChainProblem | None]:
    """Walk a chain in order; (entries read, first problem or None).

    Checks, per entry: consecutive numbering, the link to the previous hash,
    the entry's own hash, and (with ``public_key``) the signature of every
    entry after ``signed_from`` (the last entry written before the ledger had
    a key: earlier entries are covered through the chain by the first signed one).

    ``signed_from`` is read from the database it checks, so it is not taken on
    its word: the entry right after it must be the key's own adoption, signed
    (``audit_key`` naming that key and ``signed_after == signed_from``). Moving
    it past the entries one rewrote leaves no such entry there.
    """
    prev = GENESIS
    n = 0
    for row in rows:
        n += 1
        if (
            public_key is not None
            and 0 < signed_from == n - 1
            and not _adoption(row, public_key, signed_from)
        ):
            return n, ChainProblem(
                n,
                f"the log says it is signed only after entry {signed_from}, but this entry "
                "is not the adoption of the guardian's audit key: the start of signing was "
                "moved, so that the entries after it need no signature",
            )
        at = row.at if row.at.tzinfo else row.at.replace(tzinfo=dt.UTC)
        if row.seq != n:
            return n, ChainProblem(n, f"missing: the next entry is numbered {row.seq}")
        if row.prev_hash != prev:
            return n, ChainProblem(n, "it does not link to the entry before it")
        if digest(prev, row.seq, at, row.actor, row.action, row.detail, row.note) != row.hash:
            return n, ChainProblem(n, "its content does not match its hash: it was altered")
        if public_key is not None and row.seq > signed_from:
            if not row.signature:
                return n, ChainProblem(
                    n, "it is not signed: it was written without the guardian's audit key"
                )
            if not head_signed(public_key, AuditHead(row.seq, row.hash, row.signature)):
                return n, ChainProblem(
                    n,
                    "its signature does not match: the entry, or one before it, was "
                    "rewritten after it was signed",
                )
        prev = row.hash
    if public_key is not None and 0 < signed_from >= n:
        return n, ChainProblem(
            n + 1,
            f"the log says it is signed only after entry {signed_from}, but it ends at entry "
            f"{n}: the adoption of the guardian's audit key is missing",
        )
    return n, None


def _adoption(row: ChainRow, public_key: str, signed_from: int) -> bool:
    """Is ``row`` the entry that adopted ``public_key`` after entry ``signed_from``?"""
    detail = row.detail
    return (
        row.action == "audit_key"
        and str(detail.get("public_key", "")).lower() == public_key.lower()
        and detail.get("signed_after") == signed_from
    )
