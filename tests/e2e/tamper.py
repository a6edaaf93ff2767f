"""What someone with write access to a ledger's database can do to its audit log."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, update

from services.common.db import as_utc
from services.common.ledger import Ledger, audit
from services.common.ledger.models import AuditRow


def snapshot(db: str, to: Path) -> str:
    """A consistent copy of a live SQLite ledger (the online backup API)."""
    with sqlite3.connect(db) as src, sqlite3.connect(to) as dst:
        src.backup(dst)
    return str(to)


def rewrite(url: str, seq: int, actor: str, key: Ed25519PrivateKey | None = None) -> None:
    """Change entry ``seq``'s actor and recompute every hash after it, so the bare chain
    is consistent again; with ``key`` (the guardian's own), sign the new heads too."""
    ledger = Ledger(url, delta=None, migrate=False)
    rows = ledger.audit_rows(0, 10**9)
    prev = rows[seq - 2].hash if seq > 1 else audit.GENESIS
    with ledger.engine.begin() as conn:
        for row in rows[seq - 1 :]:
            who = actor if row.seq == seq else row.actor
            digest = audit.digest(
                prev, row.seq, as_utc(row.at), who, row.action, row.detail, row.note
            )
            signature = row.signature if key is None else audit.sign_head(key, row.seq, digest)
            conn.execute(
                update(AuditRow)
                .where(AuditRow.seq == row.seq)
                .values(actor=who, prev_hash=prev, hash=digest, signature=signature)
            )
            prev = digest
    ledger.close()


def truncate(url: str, keep: int) -> None:
    """Remove every entry after ``keep`` (the signatures of those kept stay valid)."""
    ledger = Ledger(url, delta=None, migrate=False)
    with ledger.engine.begin() as conn:
        conn.execute(delete(AuditRow).where(AuditRow.seq > keep))
    ledger.close()
