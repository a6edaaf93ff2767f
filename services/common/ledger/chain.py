"""Appending to the hash-chained audit log inside a ledger transaction (SQLAlchemy Core).

A transaction gathers the entries it makes and appends them at its end in one
go: the chain's head is read once under its row lock, each entry is hashed
onto the one before (and signed, with the ledger's key), the rows go in with
one multi-row insert, and the head is written once. The entries and hashes are
exactly those one append per entry would make, so the chain checks the same
(:func:`services.common.ledger.audit.check_chain`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Connection

from capc.round.errors import LedgerRefusedError
from services.common.ledger import audit
from services.common.ledger.models import utcnow
from services.common.ledger.tables import INSERT_AUDIT, SETTING_LOCKED, UPDATE_SETTING

#: The setting that holds the chain's head: JSON [seq, hash, signature].
HEAD = "audit_head"


class Entry(NamedTuple):
    """An audit entry to append: ``actor`` authenticated, ``note`` untrusted free text."""

    actor: str
    action: str
    detail: Mapping[str, object]
    note: str | None = None


def append(conn: Connection, entries: Sequence[Entry], signer: Ed25519PrivateKey | None) -> None:
    """Append ``entries`` in order, in ``conn``'s transaction."""
    if not entries:
        return
    value = SETTING_LOCKED.scalar(conn, {"key": HEAD})
    if value is None:
        raise LedgerRefusedError("the ledger has no audit head: its schema was not migrated")
    seq, prev = json.loads(value)[:2]
    rows = []
    signature: str | None = None
    for e in entries:
        seq += 1
        at = utcnow()
        detail = dict(e.detail)
        digest = audit.digest(prev, seq, at, e.actor, e.action, detail, e.note)
        signature = None if signer is None else audit.sign_head(signer, seq, digest)
        rows.append(
            {
                "seq": seq,
                "at": at,
                "actor": e.actor,
                "action": e.action,
                "detail": detail,
                "prev_hash": prev,
                "hash": digest,
                "note": e.note,
                "signature": signature,
            }
        )
        prev = digest
    INSERT_AUDIT.run_many(conn, rows)
    UPDATE_SETTING.run(conn, {"b_key": HEAD, "b_value": json.dumps([seq, prev, signature or ""])})
