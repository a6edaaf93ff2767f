"""The ledger's audit log: the signing key it adopts, the head of its hash chain,
entries a service records, and reading and checking the chain.

Entries are appended by :mod:`services.common.ledger.chain`, in the transaction of
the change they record; the hash chain and its signed heads are
:mod:`services.common.ledger.audit`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select
from sqlalchemy.orm import Session

from capc.round.errors import LedgerRefusedError
from services.common.ledger import audit, chain
from services.common.ledger import disputes as dispute_log
from services.common.ledger.audit import AuditHead, ChainProblem
from services.common.ledger.base import LedgerBase
from services.common.ledger.models import AuditRow
from services.common.ledger.records import AuditEntry
from services.common.ledger.tables import INSERT_SETTING, SETTING, SETTING_LOCKED


class AuditLog(LedgerBase):
    """The hash-chained audit log of a ledger."""

    def _adopt_key(self, signer: Ed25519PrivateKey) -> None:
        """Record which key signs this ledger's audit heads, from which entry on; refuse
        another key later (its signatures would not verify the earlier heads)."""
        mine = audit.public_hex(signer)
        with self._write() as conn:
            have = SETTING_LOCKED.scalar(conn, {"key": "audit_key"})
            if have is None:
                head = SETTING.scalar(conn, {"key": chain.HEAD})
                seq = int(json.loads(head)[0])
                conn.execute(
                    INSERT_SETTING,
                    {"key": "audit_key", "value": json.dumps({"key": mine, "from": seq})},
                )
                self._signer = signer
                self._audit(conn, "ledger", "audit_key", {"public_key": mine, "signed_after": seq})
                return
        key = str(json.loads(have)["key"])
        if key != mine:
            raise LedgerRefusedError(
                f"this ledger's audit log is signed by key {key[:16]}..., the key given is "
                f"{mine[:16]}...; start with the key file that signed it (a new key would leave "
                "every stored head unverifiable)"
            )
        self._signer = signer

    def audit_key(self) -> tuple[str, int] | None:
        """(public key hex, last entry written before it signed), or None: no key yet."""
        with self.engine.connect() as conn:
            value = SETTING.scalar(conn, {"key": "audit_key"})
        if value is None:
            return None
        saved = json.loads(value)
        return str(saved["key"]), int(saved["from"])

    def audit_head(self) -> AuditHead:
        """The audit chain's current head, signed (the signature is empty without a key)."""
        with self.engine.connect() as conn:
            value = json.loads(SETTING.scalar(conn, {"key": chain.HEAD}))
        return AuditHead(int(value[0]), str(value[1]), str(value[2]) if len(value) > 2 else "")

    def record(
        self, actor: str, action: str, detail: Mapping[str, object], note: str | None = None
    ) -> None:
        """Append an event a service observed (not a ledger change) to the audit log.

        ``actor`` must be an authenticated identity; anything a caller wrote
        itself goes in ``note`` (kept, never trusted; at most 1000 characters).
        """
        if not actor or len(actor) > 128 or not action or len(action) > 64:
            raise LedgerRefusedError(
                f"an audit entry needs an actor of 1-128 and an action of 1-64 characters, "
                f"got {actor!r} and {action!r}"
            )
        with self._write() as conn:
            self._audit(conn, actor, action, detail, None if note is None else note[:1000])

    def check_audit(self, public_key: str | None = None) -> tuple[int, ChainProblem | None]:
        """Walk the whole chain: (entries, first problem or None). Signatures are checked
        against ``public_key`` (hex), by default the key this ledger records."""
        key = self.audit_key()
        if public_key is None and key is not None:
            public_key = key[0]
        signed_from = key[1] if key is not None else 0
        with Session(self.engine) as s:
            rows = s.scalars(select(AuditRow).order_by(AuditRow.seq))
            return audit.check_chain(rows, public_key, signed_from)

    def verify_audit(self) -> int:
        """Check the whole chain (and every head's signature where the ledger has a key);
        returns its length, raises LedgerRefusedError naming the first bad entry."""
        n, problem = self.check_audit()
        if problem is not None:
            raise LedgerRefusedError(f"audit log broken at entry {problem.seq}: {problem.reason}")
        return n

    def audit_entries(self, limit: int = 100, offset: int = 0) -> list[AuditEntry]:
        """Newest first."""
        with Session(self.engine) as s:
            rows = s.scalars(
                select(AuditRow).order_by(AuditRow.seq.desc()).limit(limit).offset(offset)
            )
            return [
                AuditEntry(
                    r.seq,
                    r.at.isoformat(),
                    r.actor,
                    r.action,
                    dict(r.detail),
                    r.hash,
                    r.note,
                    r.signature,
                )
                for r in rows
            ]

    def disputes(self) -> list[dispute_log.Dispute]:
        """Failed checks per (querier, party) pair over the whole audit log, with where
        each pair's pattern points (:mod:`services.common.ledger.disputes`)."""
        with Session(self.engine) as s:
            rows = s.execute(
                select(AuditRow.action, AuditRow.actor, AuditRow.detail).where(
                    AuditRow.action.in_((dispute_log.DISPUTE, dispute_log.LEGACY_INVALID_VOTE))
                )
            )
            pairs = [dispute_log.dispute_pair(a, who, dict(d)) for a, who, d in rows]
        return dispute_log.attribute(p for p in pairs if p is not None)

    def audit_rows(self, after: int = 0, limit: int = 1000) -> list[AuditRow]:
        """Raw entries with seq > ``after``, oldest first (for verification)."""
        with Session(self.engine, expire_on_commit=False) as s:
            return list(
                s.scalars(
                    select(AuditRow).where(AuditRow.seq > after).order_by(AuditRow.seq).limit(limit)
                )
            )
