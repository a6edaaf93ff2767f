"""The ledger's schema and what it is created with: Alembic migrations, the schema
revision check, and the accountant and delta fixed when a ledger is created."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import tempfile
import threading
from pathlib import Path

import numpy as np
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from numpy.typing import ArrayLike
from sqlalchemy import make_url, select

from capc.privacy import accountants
from capc.privacy.accountants import Accounting, RenyiDp
from capc.privacy.conversion import DEFAULT_ORDERS
from capc.round.errors import LedgerRefusedError
from services.common.ledger import audit
from services.common.ledger.base import LedgerBase
from services.common.ledger.models import Setting

MIGRATIONS = Path(__file__).with_name("migrations")
HEAD_REVISION = "0009"
_MIGRATION_LOCK = threading.Lock()
#: This process's new SQLite ledger at HEAD_REVISION, as bytes (None until it migrated
#: one): a process that keeps many ledgers (an answerer hosting many hospitals) runs the
#: migrations once, about 0.14 s of CPU each time, and copies the result for the others.
_fresh_sqlite: list[bytes] = []


class Schema(LedgerBase):
    """Migrations and the settings a ledger is created with."""

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision."""
        with _MIGRATION_LOCK:  # Alembic's op/context proxies are process-global
            new = self._new_sqlite_file()
            if new is not None and _fresh_sqlite and _place(new, _fresh_sqlite[0]):
                return
            self._migrate()
            if new is not None and not _fresh_sqlite:
                _fresh_sqlite.append(_snapshot(new))

    def _new_sqlite_file(self) -> Path | None:
        """The ledger's file, where it is a SQLite file that does not exist yet."""
        url = make_url(str(self.url))
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return None
        path = Path(str(url.database))
        return None if path.exists() else path

    def _migrate(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()

    def _check_revision(self) -> None:
        with self.engine.connect() as conn:
            rev = MigrationContext.configure(conn).get_current_revision()
        if rev != HEAD_REVISION:
            raise LedgerRefusedError(
                f"ledger schema is at revision {rev}, this guardian needs {HEAD_REVISION}; run `capc guardian --migrate`"
            )

    def _settings(
        self, kind: str | None, orders: ArrayLike | None, given: float | None
    ) -> tuple[Accounting, float]:
        # None: whatever delta the ledger was created with (readers such as `capc audit`).
        delta = 1e-5 if given is None else given
        if not (0 < delta < 1):
            raise LedgerRefusedError(f"delta must lie in (0, 1), got {delta}")
        if kind is not None and kind not in accountants.ACCOUNTANTS:
            raise LedgerRefusedError(
                f"unknown accountant {kind!r}; choose one of {', '.join(accountants.ACCOUNTANTS)}"
            )
        with self._tx() as s:
            stored = {row.key: row.value for row in s.scalars(select(Setting))}
            if "accountant" not in stored:
                name = kind or (
                    RenyiDp.name if orders is not None else accountants.DEFAULT_ACCOUNTANT
                )
                if name == RenyiDp.name:
                    fresh: Accounting = RenyiDp(DEFAULT_ORDERS if orders is None else orders)
                elif orders is not None:
                    raise LedgerRefusedError(f"the {name} accountant takes no Renyi orders")
                else:
                    fresh = accountants.make(name)
                saved = {"name": fresh.name, **fresh.settings()}
                s.add(Setting(key="accountant", value=json.dumps(saved)))
                s.add(Setting(key="delta", value=repr(float(delta))))
                s.add(Setting(key="audit_head", value=json.dumps([0, audit.GENESIS])))
                return fresh, float(delta)
        saved = json.loads(stored["accountant"])
        have = accountants.make(str(saved.pop("name")), saved)
        have_delta = float(stored["delta"])
        if kind is not None and kind != have.name:
            raise LedgerRefusedError(
                f"this ledger was created with the {have.name} accountant, not {kind}; "
                "open it without choosing one"
            )
        if orders is not None and not (
            isinstance(have, RenyiDp) and np.array_equal(have.orders, np.asarray(orders))
        ):
            raise LedgerRefusedError(
                "this ledger was created with another order grid; open it without `orders`"
            )
        if given is not None and have_delta != delta:
            raise LedgerRefusedError(f"this ledger accounts at delta={have_delta}, not {delta}")
        return have, have_delta

    @property
    def accountant(self) -> str:
        """The name of the ledger's accountant."""
        return self.accounting.name

    def accounting_json(self) -> str:
        """What two ledgers must share for their loss vectors to be compared, as canonical
        JSON: the accountant with its settings, and delta."""
        ident = {
            "accountant": {"name": self.accounting.name, **self.accounting.settings()},
            "delta": self.delta,
        }
        return json.dumps(ident, sort_keys=True, separators=(",", ":"))


def _snapshot(path: Path) -> bytes:
    """The SQLite database at ``path``, whole (its write-ahead log included), as bytes."""
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "fresh.db"
        with (
            contextlib.closing(sqlite3.connect(path)) as src,
            contextlib.closing(sqlite3.connect(copy)) as dst,
        ):
            src.backup(dst)
        return copy.read_bytes()


def _place(path: Path, data: bytes) -> bool:
    """Writes ``data`` as the new file ``path``, whole or not at all: False, and nothing
    written, where ``path`` appeared meanwhile (another process created that ledger)."""
    folder = path.parent
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(partial, path)  # fails, leaving the other file, where it exists
        except FileExistsError:
            return False
        except OSError:
            # A filesystem without hard links (some network and container volumes):
            # the caller migrates the new file as it would without a copy.
            return False
        dirfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dirfd)
        finally:
            os.close(dirfd)
        return True
    finally:
        os.unlink(partial)
